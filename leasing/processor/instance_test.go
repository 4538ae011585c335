package processor_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/internal/dbtest"
	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/processor"
)

// instanceChildEnv names the database URL TestInstanceChild runs on; the
// test runs only in the child process TestInstanceTakeover starts.
const instanceChildEnv = "LEASESTORE_INSTANCE_CHILD_URL"

// instanceLease is the lease duration of the instance tests: far longer
// than the tests wait, so that only a takeover finishes them.
const instanceLease = 10 * time.Minute

// instanceStore opens a pool on url and returns the inbox store and the
// pool's connection config.
func instanceStore(t testing.TB, url string) (*leasing.Postgres, *pgx.ConnConfig) {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), url)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	pg, err := leasing.NewPostgres(pool, leasing.Inbox, leasing.PostgresOptions{})
	require.NoError(t, err)
	return pg, pool.Config().ConnConfig
}

// TestInstanceChild is the process TestInstanceTakeover kills: a processor
// with instance id "pod-0" whose handlers never return. It prints its lease
// owner, then runs until killed.
func TestInstanceChild(t *testing.T) {
	url := os.Getenv(instanceChildEnv)
	if url == "" {
		t.Skip("runs as TestInstanceTakeover's child process")
	}
	pg, cfg := instanceStore(t, url)
	p, err := processor.New(pg, func(ctx context.Context, _ leasing.Lease) error { <-ctx.Done(); return ctx.Err() },
		processor.Options{InstanceID: "pod-0", DirectConfig: cfg, LeaseDuration: instanceLease, Concurrency: 20,
			HandlerTimeout: processor.NoHandlerTimeout})
	require.NoError(t, err)
	fmt.Printf("owner %s\n", p.Owner())
	_ = p.Run(context.Background()) // killed before it returns
}

// TestInstanceTakeover: while a processor process holding leases lives,
// another process with its instance id refuses to run; once it is killed
// (SIGKILL), its successor with the same instance id ends the dead
// incarnation's leases and reclaims them at once, long before they
// expire: each message's history shows the killed owner's attempt as
// expired (counted: the handler may have run), and the message completed
// by the successor in attempt 2.
func TestInstanceTakeover(t *testing.T) {
	t.Parallel()
	url := dbtest.DatabaseURL(t)
	pg, cfg := instanceStore(t, url)
	msgs := make([]leasing.NewMessage, 20)
	for i := range msgs {
		msgs[i] = leasing.NewMessage{Type: "t", Payload: fmt.Appendf(nil, "m%d", i)}
	}
	res, err := pg.Enqueue(t.Context(), msgs...)
	require.NoError(t, err)

	child := exec.Command(os.Args[0], "-test.run=^TestInstanceChild$", "-test.count=1")
	child.Env = append(os.Environ(), instanceChildEnv+"="+url)
	out, err := child.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, child.Start())
	killed := false
	t.Cleanup(func() {
		if !killed {
			_ = child.Process.Kill()
			_ = child.Wait()
		}
	})
	var oldOwner string
	lines := bufio.NewScanner(out)
	for lines.Scan() {
		if o, ok := strings.CutPrefix(lines.Text(), "owner "); ok {
			oldOwner = o
			break
		}
	}
	require.True(t, strings.HasPrefix(oldOwner, "inbox@pod-0-"), oldOwner)
	require.Eventually(t, func() bool {
		for _, id := range res.IDs {
			row, err := pg.Get(t.Context(), id)
			if err != nil || row.LeaseOwner != oldOwner {
				return false
			}
		}
		return true
	}, 30*time.Second, 20*time.Millisecond, "the child leases every message")
	expiries := map[uuid.UUID]time.Time{}
	for _, id := range res.IDs {
		row, err := pg.Get(t.Context(), id)
		require.NoError(t, err)
		expiries[id] = *row.LeaseExpiresAt
	}
	// While the child lives, a second process with its identity refuses.
	twin, err := processor.New(pg, func(context.Context, leasing.Lease) error { return nil },
		processor.Options{InstanceID: "pod-0", DirectConfig: cfg, LeaseDuration: instanceLease})
	require.NoError(t, err)
	require.ErrorIs(t, twin.Run(context.Background()), leasing.ErrInstanceInUse)

	require.NoError(t, child.Process.Kill())
	_ = child.Wait()
	killed = true

	var mu sync.Mutex
	done := map[uuid.UUID]bool{}
	p, err := processor.New(pg, func(_ context.Context, l leasing.Lease) error {
		mu.Lock()
		defer mu.Unlock()
		done[l.Message.ID] = true
		return nil
	}, processor.Options{InstanceID: "pod-0", DirectConfig: cfg, LeaseDuration: instanceLease, PollInterval: 50 * time.Millisecond})
	require.NoError(t, err)
	require.NotEqual(t, oldOwner, p.Owner())
	errc := make(chan error, 1)
	start := time.Now()
	go func() { errc <- p.Run(context.Background()) }()
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(done) == len(res.IDs)
	}, 30*time.Second, 10*time.Millisecond, "the successor reclaims the killed process's leases")
	t.Logf("the successor handled the %d taken-over messages %s after its start", len(res.IDs), time.Since(start).Round(time.Millisecond))
	require.NoError(t, p.Stop(context.Background()))
	require.NoError(t, <-errc)

	for _, id := range res.IDs {
		row, err := pg.Get(t.Context(), id)
		require.NoError(t, err)
		require.Equal(t, leasing.StatusCompleted, row.Status)
		require.Len(t, row.Attempts, 2, "%+v", row.Attempts)
		first, second := row.Attempts[0], row.Attempts[1]
		require.Equal(t, leasing.AttemptExpired, first.End)
		require.Equal(t, oldOwner, first.Owner)
		require.Equal(t, 1, first.Attempt, "the killed attempt is counted")
		require.True(t, first.FinishedAt.Before(expiries[id].Add(-instanceLease/2)),
			"lease ended by the successor at %s, not at its expiry %s", first.FinishedAt, expiries[id])
		require.Equal(t, leasing.AttemptCompleted, second.End)
		require.Equal(t, p.Owner(), second.Owner)
		require.Equal(t, 2, second.Attempt)
	}
}

// TestInstanceInUse: a second live processor with a running one's
// instance id refuses to run with a *leasing.InstanceInUseError, claims
// nothing and reports it in Health; the first goes on. A processor with
// another instance id runs beside them.
func TestInstanceInUse(t *testing.T) {
	t.Parallel()
	pg, cfg := instanceStore(t, dbtest.DatabaseURL(t))
	handler := func(context.Context, leasing.Lease) error { return nil }
	opts := processor.Options{InstanceID: "pod-0", DirectConfig: cfg, PollInterval: 20 * time.Millisecond}
	first, err := processor.New(pg, handler, opts)
	require.NoError(t, err)
	errc := make(chan error, 1)
	go func() { errc <- first.Run(context.Background()) }()
	require.Eventually(t, func() bool { return first.Health().Ready }, 10*time.Second, 5*time.Millisecond)

	second, err := processor.New(pg, handler, opts)
	require.NoError(t, err)
	runErr := second.Run(context.Background())
	var inUse *leasing.InstanceInUseError
	require.ErrorAs(t, runErr, &inUse)
	require.True(t, errors.Is(runErr, leasing.ErrInstanceInUse))
	require.Equal(t, "inbox@pod-0", inUse.Label)
	require.NotZero(t, inUse.HolderPID)
	h := second.Health()
	require.Equal(t, processor.StateInstanceInUse, h.State)
	require.False(t, h.Live)
	require.True(t, second.Health().LastClaim.IsZero(), "the refused processor never claimed")

	other := opts
	other.InstanceID = "pod-1"
	third, err := processor.New(pg, handler, other)
	require.NoError(t, err)
	errc3 := make(chan error, 1)
	go func() { errc3 <- third.Run(context.Background()) }()
	require.Eventually(t, func() bool { return third.Health().Ready }, 10*time.Second, 5*time.Millisecond)

	require.True(t, first.Health().Ready)
	require.NoError(t, first.Stop(context.Background()))
	require.NoError(t, <-errc)
	require.NoError(t, third.Stop(context.Background()))
	require.NoError(t, <-errc3)
}

// TestInstanceOptions: an instance id needs a direct connection config,
// and a direct connection config a Postgres store.
func TestInstanceOptions(t *testing.T) {
	t.Parallel()
	b := setupProcessor(t, leasing.Inbox)
	handler := func(context.Context, leasing.Lease) error { return nil }
	_, err := processor.New(b.mem, handler, processor.Options{InstanceID: "pod-0"})
	require.ErrorIs(t, err, leasing.ErrInvalidArgument)
	cfg, err := pgx.ParseConfig("postgres://127.0.0.1:1/x")
	require.NoError(t, err)
	_, err = processor.New(b.mem, handler, processor.Options{InstanceID: "pod-0", DirectConfig: cfg})
	require.ErrorIs(t, err, leasing.ErrInvalidArgument)
	_, err = processor.New(b.mem, handler, processor.Options{Owner: strings.Repeat("o", leasing.MaxOwnerLabelBytes), InstanceID: "x", DirectConfig: cfg})
	require.ErrorIs(t, err, leasing.ErrInvalidArgument)
}

// TestInstanceLockLost: when the session holding a running processor's
// identity ends and another takes the identity meanwhile, the processor
// notices at its next check and stops with a *leasing.InstanceInUseError
// rather than share the identity.
func TestInstanceLockLost(t *testing.T) {
	t.Parallel()
	url := dbtest.DatabaseURL(t)
	pg, cfg := instanceStore(t, url)
	p, err := processor.New(pg, func(context.Context, leasing.Lease) error { return nil }, processor.Options{
		InstanceID: "pod-0", DirectConfig: cfg, PollInterval: 20 * time.Millisecond,
		LeaseDuration: 3 * time.Second, HeartbeatInterval: 500 * time.Millisecond,
	})
	require.NoError(t, err)
	errc := make(chan error, 1)
	go func() { errc <- p.Run(context.Background()) }()
	require.Eventually(t, func() bool { return p.Health().Ready }, 10*time.Second, 5*time.Millisecond)

	// The thief queues for the identity's advisory lock (the name
	// LockInstance hashes) before the holder's session ends, so that it
	// takes the lock ahead of the processor's own retry: a waiting
	// request goes before later try-locks.
	ctx := t.Context()
	thief, err := pgx.ConnectConfig(ctx, cfg.Copy())
	require.NoError(t, err)
	defer func() { require.NoError(t, thief.Close(context.WithoutCancel(ctx))) }()
	locked := make(chan error, 1)
	go func() {
		_, err := thief.Exec(ctx, "SELECT pg_advisory_lock(hashtextextended('leasestore:instance:inbox:inbox@pod-0', 0))")
		locked <- err
	}()
	require.Eventually(t, func() bool {
		var waiting bool
		err := pg.Pool().QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND pid = $1)",
			thief.PgConn().PID()).Scan(&waiting)
		return err == nil && waiting
	}, 10*time.Second, 5*time.Millisecond, "the thief waits for the identity")
	var terminated bool
	require.NoError(t, pg.Pool().QueryRow(ctx, "SELECT bool_and(pg_terminate_backend(pid)) FROM pg_locks WHERE locktype = 'advisory' AND granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database())").Scan(&terminated))
	require.True(t, terminated)
	select {
	case err := <-locked:
		require.NoError(t, err, "the thief took the identity when its holder's session ended")
	case <-time.After(10 * time.Second):
		require.FailNow(t, "the terminated session's lock stayed held")
	}

	var runErr error
	select {
	case runErr = <-errc:
	case <-time.After(20 * time.Second):
		require.FailNow(t, "the processor did not notice that another session took its identity")
	}
	require.ErrorIs(t, runErr, leasing.ErrInstanceInUse)
	require.Equal(t, processor.StateInstanceInUse, p.Health().State)
}
