package leasing_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/internal/dbtest"
	"github.com/leasestore/leasestore/leasing"
)

// expireStore is a store that ends earlier incarnations' leases.
type expireStore interface {
	leasing.Store
	ExpirePrevious(ctx context.Context, label, owner string) ([]uuid.UUID, error)
}

// TestExpirePrevious: both stores end exactly the unexpired leases of the
// label's other owners: not the caller's own, not those of a label that
// merely starts alike, and the rows are reclaimed as expired leases with
// their attempt counted.
func TestExpirePrevious(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	pg, err := leasing.NewPostgres(pool, leasing.Inbox, leasing.PostgresOptions{})
	require.NoError(t, err)
	mem, err := leasing.NewMemory(leasing.Inbox, leasing.MemoryOptions{})
	require.NoError(t, err)
	for name, s := range map[string]expireStore{"postgres": pg, "memory": mem} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			claim := func(owner string) uuid.UUID {
				t.Helper()
				res, err := s.Enqueue(ctx, leasing.NewMessage{Type: "t", Payload: []byte(owner)})
				require.NoError(t, err)
				leases, err := s.Claim(ctx, leasing.ClaimRequest{Owner: owner, BatchSize: 1, LeaseFor: time.Hour})
				require.NoError(t, err)
				require.Len(t, leases, 1)
				require.Equal(t, res.IDs[0], leases[0].Message.ID)
				return res.IDs[0]
			}
			dead := claim(leasing.NewOwner("inbox@pod-0"))
			current := leasing.NewOwner("inbox@pod-0")
			own := claim(current)
			longer := claim(leasing.NewOwner("inbox@pod-0x"))
			other := claim("inbox@pod-0-not-a-suffix-of-12")

			ids, err := s.ExpirePrevious(ctx, "inbox@pod-0", current)
			require.NoError(t, err)
			require.Equal(t, []uuid.UUID{dead}, ids)
			again, err := s.ExpirePrevious(ctx, "inbox@pod-0", current)
			require.NoError(t, err)
			require.Empty(t, again, "an ended lease is not ended again")

			leases, err := s.Claim(ctx, leasing.ClaimRequest{Owner: current, BatchSize: 10, LeaseFor: time.Hour})
			require.NoError(t, err)
			require.Len(t, leases, 1)
			require.Equal(t, dead, leases[0].Message.ID)
			require.Equal(t, 2, leases[0].Attempt, "the ended attempt counts")
			row, err := s.Get(ctx, dead)
			require.NoError(t, err)
			require.Equal(t, leasing.AttemptExpired, row.Attempts[len(row.Attempts)-1].End)
			for _, id := range []uuid.UUID{own, longer, other} {
				row, err := s.Get(ctx, id)
				require.NoError(t, err)
				require.True(t, row.LeaseExpiresAt.After(time.Now().Add(30*time.Minute)), "lease of %s kept", row.LeaseOwner)
			}

			_, err = s.ExpirePrevious(ctx, "", current)
			require.ErrorIs(t, err, leasing.ErrInvalidArgument)
			_, err = s.ExpirePrevious(ctx, "inbox@pod-0", "")
			require.ErrorIs(t, err, leasing.ErrInvalidArgument)
		})
	}
}

// TestLockInstance: one session holds an identity; a second is refused
// with the holder's pid until the first closes; other identities and
// queues are independent.
func TestLockInstance(t *testing.T) {
	t.Parallel()
	pool := dbtest.NewPool(t)
	cfg := pool.Config().ConnConfig
	ctx := context.Background()
	first, err := leasing.LockInstance(ctx, cfg, leasing.Inbox, "inbox@pod-0")
	require.NoError(t, err)
	require.NoError(t, first.Ping(ctx))

	_, err = leasing.LockInstance(ctx, cfg, leasing.Inbox, "inbox@pod-0")
	var inUse *leasing.InstanceInUseError
	require.ErrorAs(t, err, &inUse)
	require.ErrorIs(t, err, leasing.ErrInstanceInUse)
	require.NotZero(t, inUse.HolderPID)

	for _, k := range []struct {
		q     leasing.Queue
		label string
	}{{leasing.Inbox, "inbox@pod-1"}, {leasing.Outbox, "inbox@pod-0"}} {
		l, err := leasing.LockInstance(ctx, cfg, k.q, k.label)
		require.NoError(t, err)
		require.NoError(t, l.Close(ctx))
	}

	require.NoError(t, first.Close(ctx))
	second, err := leasing.LockInstance(ctx, cfg, leasing.Inbox, "inbox@pod-0")
	require.NoError(t, err)
	require.NoError(t, second.Close(ctx))

	_, err = leasing.LockInstance(ctx, nil, leasing.Inbox, "x")
	require.ErrorIs(t, err, leasing.ErrInvalidArgument)
	_, err = leasing.LockInstance(ctx, cfg, leasing.Inbox, strings.Repeat("x", leasing.MaxOwnerLabelBytes+1))
	require.ErrorIs(t, err, leasing.ErrInvalidArgument)
}

// TestPgBouncerInstanceAndRetention: through a transaction-mode pooler the
// identity's lock would stay on a server session others share:
// LockInstance sees that the holder is not its connection and refuses.
func TestPgBouncerInstanceAndRetention(t *testing.T) {
	t.Parallel()
	url := dbtest.PgBouncerURL(t, dbtest.DatabaseURL(t))
	cfg, err := pgx.ParseConfig(url)
	require.NoError(t, err)
	cfg.DefaultQueryExecMode = pgx.QueryExecModeExec
	_, err = leasing.LockInstance(context.Background(), cfg, leasing.Inbox, "inbox@pod-0")
	require.ErrorContains(t, err, "not through a pooler")

	// Retention's turn is a transaction-level lock: it works through the
	// pooler, and concurrent runners take turns.
	pool, err := pgxpool.New(t.Context(), withQueryMode(t, url, poolerQueryMode))
	require.NoError(t, err)
	defer pool.Close()
	store, err := leasing.NewPostgres(pool, leasing.Inbox, leasing.PostgresOptions{})
	require.NoError(t, err)
	errs := make(chan error, 4)
	for range 4 {
		go func() {
			_, err := store.PurgeRetention(t.Context(), leasing.RetentionPolicy{Finished: time.Hour, DeadLettered: time.Hour})
			errs <- err
		}()
	}
	for range 4 {
		require.NoError(t, <-errs)
	}
}
