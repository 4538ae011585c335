package leasing_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/internal/dbtest"
	"github.com/leasestore/leasestore/leasing"
)

// txStore is a store and the transactions producer code enqueues in: a
// Memory transaction, or a pgx.Tx bound with Postgres.InTx.
type txStore struct {
	store leasing.Store
	begin func(t *testing.T) (leasing.Enqueuer, func() error, func() error) // enqueuer, commit, rollback
}

func txStores(t *testing.T) map[string]txStore {
	mem, err := leasing.NewMemory(leasing.Inbox, leasing.MemoryOptions{})
	require.NoError(t, err)
	pg := dbtest.OpenStore(t, dbtest.DatabaseURL(t), leasing.Inbox, leasing.PostgresOptions{})
	return map[string]txStore{
		"memory": {store: mem, begin: func(t *testing.T) (leasing.Enqueuer, func() error, func() error) {
			tx := mem.Begin()
			return tx, func() error { return tx.Commit(context.Background()) }, func() error { return tx.Rollback(context.Background()) }
		}},
		"postgres": {store: pg, begin: func(t *testing.T) (leasing.Enqueuer, func() error, func() error) {
			tx, err := pg.Pool().Begin(t.Context())
			require.NoError(t, err)
			return pg.InTx(tx), func() error { return tx.Commit(context.Background()) }, func() error { return tx.Rollback(context.Background()) }
		}},
	}
}

// TestEnqueueInTransaction holds a Memory transaction to what a pgx.Tx
// does with EnqueueTx: invisible until commit, gone on rollback,
// duplicates reported against the store and the transaction, closed after
// either end.
func TestEnqueueInTransaction(t *testing.T) {
	for name, s := range txStores(t) {
		t.Run(name, func(t *testing.T) {
			ctx := t.Context()
			stored, err := s.store.Enqueue(ctx, leasing.NewMessage{IdempotencyKey: "a"})
			require.NoError(t, err)

			q, commit, _ := s.begin(t)
			res, err := q.Enqueue(ctx, leasing.NewMessage{IdempotencyKey: "b"}, leasing.NewMessage{IdempotencyKey: "a"})
			require.NoError(t, err)
			require.Equal(t, []leasing.Duplicate{{Index: 1, ID: stored.IDs[0]}}, res.Duplicates)
			again, err := q.Enqueue(ctx, leasing.NewMessage{IdempotencyKey: "b"})
			require.NoError(t, err)
			require.Equal(t, []leasing.Duplicate{{Index: 0, ID: res.IDs[0]}}, again.Duplicates, "a duplicate of the transaction's own message")
			_, err = s.store.Get(ctx, res.IDs[0])
			require.ErrorIs(t, err, leasing.ErrNotFound, "invisible before the commit")
			require.NoError(t, commit())
			row, err := s.store.Get(ctx, res.IDs[0])
			require.NoError(t, err)
			require.Equal(t, leasing.StatusPending, row.Status)
			_, err = q.Enqueue(ctx, leasing.NewMessage{})
			require.ErrorIs(t, err, pgx.ErrTxClosed)

			q, _, rollback := s.begin(t)
			res, err = q.Enqueue(ctx, leasing.NewMessage{IdempotencyKey: "c"})
			require.NoError(t, err)
			require.NoError(t, rollback())
			_, err = s.store.Get(ctx, res.IDs[0])
			require.ErrorIs(t, err, leasing.ErrNotFound, "gone with the rollback")
			st, err := s.store.Stats(ctx)
			require.NoError(t, err)
			require.EqualValues(t, 2, st.Depth[leasing.StatusPending])
		})
	}
}

// TestMemoryTxCommitSettlesLaterDuplicates: a message stored after the
// transaction's Enqueue that duplicates one of its messages came first.
func TestMemoryTxCommitSettlesLaterDuplicates(t *testing.T) {
	ctx := t.Context()
	inbox, err := leasing.NewMemory(leasing.Inbox, leasing.MemoryOptions{})
	require.NoError(t, err)
	tx := inbox.Begin()
	res, err := tx.Enqueue(ctx, leasing.NewMessage{IdempotencyKey: "k"}, leasing.NewMessage{IdempotencyKey: "other"})
	require.NoError(t, err)
	first, err := inbox.Enqueue(ctx, leasing.NewMessage{IdempotencyKey: "k"})
	require.NoError(t, err)
	require.Empty(t, first.Duplicates)
	require.NoError(t, tx.Commit(ctx))
	_, err = inbox.Get(ctx, res.IDs[0])
	require.ErrorIs(t, err, leasing.ErrNotFound, "the other enqueue of key k came first")
	_, err = inbox.Get(ctx, res.IDs[1])
	require.NoError(t, err)

	outbox, err := leasing.NewMemory(leasing.Outbox, leasing.MemoryOptions{})
	require.NoError(t, err)
	otx := outbox.Begin()
	ores, err := otx.Enqueue(ctx, leasing.NewMessage{Topic: "t"}, leasing.NewMessage{Topic: "t"})
	require.NoError(t, err)
	_, err = outbox.Enqueue(ctx, leasing.NewMessage{ID: ores.IDs[1], Topic: "t"})
	require.NoError(t, err)
	require.ErrorIs(t, otx.Commit(ctx), leasing.ErrDuplicate)
	_, err = outbox.Get(ctx, ores.IDs[0])
	require.ErrorIs(t, err, leasing.ErrNotFound, "a failed commit stores nothing")
	require.ErrorIs(t, otx.Rollback(ctx), pgx.ErrTxClosed)
}
