package reliability_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	mathrand "math/rand/v2"
	"net"
	"os"
	"os/exec"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/processor"
)

// txChildEnv, set to a database URL, makes TestStressTxChild the child
// process of TestStressTxExactlyOnce: a processor that dies of SIGKILL
// around a commit.
const txChildEnv = "LEASESTORE_TX_CHILD_URL"

// txLease is the lease of the processors of the transactional stress: a
// killed child's leases expire soon.
const txLease = time.Second

// TestStressTxExactlyOnce counts the effects of a transactional inbox
// handler (processor.NewTx) against its messages under faults: child
// processes killed (SIGKILL) just before a handler's transaction sends its
// COMMIT or just after, before the reply; replies to COMMIT lost after the
// server committed or not; leases lost mid-handler to another processor.
// Every message must end completed with exactly one effect.
func TestStressTxExactlyOnce(t *testing.T) {
	if os.Getenv(txChildEnv) != "" {
		t.Skip("in the child process")
	}
	t.Parallel()
	n, kills := pick(300, 5_000), pick(3, 25)
	url := freshURL(t)
	pool := newPool(t, url, "tx-stress-check", 4)
	ctx := t.Context()
	_, err := pool.Exec(ctx, `CREATE TABLE effects (message_id uuid NOT NULL)`)
	require.NoError(t, err)
	inbox, err := leasing.NewPostgres(pool, leasing.Inbox, leasing.PostgresOptions{})
	require.NoError(t, err)
	ids := make(map[uuid.UUID]bool, n)
	for start := 0; start < n; start += leasing.MaxBatchSize {
		msgs := make([]leasing.NewMessage, min(leasing.MaxBatchSize, n-start))
		for i := range msgs {
			msgs[i] = leasing.NewMessage{Type: "payment.captured", Payload: fmt.Appendf(nil, `{"n":%d}`, start+i)}
		}
		res, err := inbox.Enqueue(ctx, msgs...)
		require.NoError(t, err)
		for _, id := range res.IDs {
			ids[id] = true
		}
	}

	// Phase 1: child processes, each killed around one of its commits.
	killed := 0
	for range kills {
		if remaining(t, pool) == 0 {
			break
		}
		if runTxChild(t, url) {
			killed++
		}
	}

	// Phase 2: two processors in this process whose COMMIT replies are
	// lost, and whose handlers sometimes lose their lease mid-call to the
	// other processor.
	admin := newPool(t, url, "tx-stress-admin", 2)
	dropper := newReplyDropper(0.2, isCommit, "COMMIT")
	stole := atomic.Int64{}
	handler := func(ctx context.Context, tx pgx.Tx, lease leasing.Lease) error {
		if err := txEffect(ctx, tx, lease); err != nil {
			return err
		}
		if mathrand.Float64() < 0.05 {
			// The lease expires under the handler: the other processor
			// may claim the message before this transaction commits.
			if _, err := admin.Exec(ctx, `UPDATE inbox_messages SET lease_expires_at = now() - interval '1 second'
				WHERE message_id = $1 AND lease_generation = $2`, lease.Message.ID, lease.Generation); err != nil {
				return err
			}
			stole.Add(1)
			time.Sleep(time.Duration(mathrand.IntN(20)) * time.Millisecond)
		}
		return nil
	}
	var procs []*processor.Processor
	ran := make(chan error, 2)
	for i := range 2 {
		cfg, err := pgxpool.ParseConfig(url)
		require.NoError(t, err)
		cfg.MaxConns = 6
		cfg.ConnConfig.DialFunc = dropper.dial
		ppool, err := pgxpool.NewWithConfig(ctx, cfg)
		require.NoError(t, err)
		t.Cleanup(ppool.Close)
		store, err := leasing.NewPostgres(ppool, leasing.Inbox, leasing.PostgresOptions{})
		require.NoError(t, err)
		p, err := processor.NewTx(store, handler, txStressOptions(fmt.Sprintf("tx-stress-%d", i)))
		require.NoError(t, err)
		procs = append(procs, p)
		go func() { ran <- p.Run(context.Background()) }()
	}
	deadline := time.Now().Add(pick(2*time.Minute, 20*time.Minute))
	for remaining(t, pool) > 0 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	for _, p := range procs {
		stopCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		require.NoError(t, p.Stop(stopCtx))
		cancel()
		require.NoError(t, <-ran)
	}
	require.Zero(t, remaining(t, pool), "every message completed")

	rows, err := pool.Query(ctx, `SELECT m.message_id, m.status, count(e.message_id)
		FROM inbox_messages AS m LEFT JOIN effects AS e USING (message_id) GROUP BY m.message_id, m.status`)
	require.NoError(t, err)
	type tally struct {
		ID      uuid.UUID
		Status  string
		Effects int64
	}
	tallies, err := pgx.CollectRows(rows, pgx.RowToStructByPos[tally])
	require.NoError(t, err)
	require.Len(t, tallies, n)
	for _, c := range tallies {
		require.True(t, ids[c.ID])
		require.Equal(t, "completed", c.Status, "message %s", c.ID)
		require.EqualValues(t, 1, c.Effects, "message %s: effects applied", c.ID)
	}
	var stray int64
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM effects WHERE message_id NOT IN (SELECT message_id FROM inbox_messages)`).Scan(&stray))
	require.Zero(t, stray)
	t.Logf("stress tx: %d messages, each applied once; %d children killed around a commit, %d commit replies dropped, %d leases expired mid-handler",
		n, killed, dropper.dropped.Load(), stole.Load())
	require.Positive(t, killed, "no child died around a commit")
	require.Positive(t, dropper.dropped.Load(), "no commit reply was dropped")
}

// TestStressTxChild is the child process of TestStressTxExactlyOnce: it
// runs a transactional processor on the database at $LEASESTORE_TX_CHILD_URL
// whose connections kill the process, now and then, as a handler's
// transaction is about to send its COMMIT, or has just sent it.
func TestStressTxChild(t *testing.T) {
	url := os.Getenv(txChildEnv)
	if url == "" {
		t.Skip("the child process of TestStressTxExactlyOnce")
	}
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	cfg.MaxConns = 6
	cfg.ConnConfig.DialFunc = (&commitKiller{rate: 0.05}).dial
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	require.NoError(t, err)
	defer pool.Close()
	store, err := leasing.NewPostgres(pool, leasing.Inbox, leasing.PostgresOptions{})
	require.NoError(t, err)
	p, err := processor.NewTx(store, txEffect, txStressOptions("tx-child"))
	require.NoError(t, err)
	fmt.Println("child running")
	_ = p.Run(t.Context()) // until killed
}

// runTxChild runs a child processor until it dies and reports whether a
// commit killed it; a child still alive after a while is killed.
func runTxChild(t *testing.T, url string) bool {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestStressTxChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), txChildEnv+"="+url)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(t, cmd.Start())
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		var exit *exec.ExitError
		require.True(t, errors.As(err, &exit), "the child ended without a kill: %v\n%s", err, out.String())
		ws, _ := exit.Sys().(syscall.WaitStatus)
		require.True(t, ws.Signaled() && ws.Signal() == syscall.SIGKILL, "the child failed: %v\n%s", err, out.String())
		return true
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		<-done
		return false
	}
}

// txEffect is the handler's effect: one row in effects, which has no
// unique constraint, so that a second application is counted.
func txEffect(ctx context.Context, tx pgx.Tx, lease leasing.Lease) error {
	_, err := tx.Exec(ctx, `INSERT INTO effects (message_id) VALUES ($1)`, lease.Message.ID)
	return err
}

func txStressOptions(owner string) processor.Options {
	return processor.Options{
		Owner: owner, Concurrency: 4, BatchSize: 8, LeaseDuration: txLease, PollInterval: 20 * time.Millisecond,
		RetryPolicy: processor.RetryPolicy{InitialDelay: 10 * time.Millisecond, MaxDelay: 50 * time.Millisecond, MaxAttempts: 1_000},
	}
}

// remaining counts the messages not completed yet.
func remaining(t *testing.T, pool *pgxpool.Pool) int64 {
	t.Helper()
	var n int64
	require.NoError(t, pool.QueryRow(t.Context(), `SELECT count(*) FROM inbox_messages WHERE status <> 'completed'`).Scan(&n))
	return n
}

// isCommit reports whether b, written to a server connection, starts the
// COMMIT of a transaction (pgx sends it as a simple query).
func isCommit(b []byte) bool {
	return len(b) > 0 && b[0] == 'Q' && bytes.Contains(bytes.ToLower(b), []byte("commit"))
}

// commitKiller kills the process with SIGKILL as a COMMIT is written, at
// rate: half the time before the COMMIT leaves, half just after.
type commitKiller struct{ rate float64 }

func (k *commitKiller) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &killingConn{Conn: c, rate: k.rate}, nil
}

type killingConn struct {
	net.Conn
	rate float64
}

func (c *killingConn) Write(b []byte) (int, error) {
	if !isCommit(b) || mathrand.Float64() >= c.rate {
		return c.Conn.Write(b)
	}
	if mathrand.IntN(2) == 0 {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	}
	n, err := c.Conn.Write(b)
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	return n, err
}
