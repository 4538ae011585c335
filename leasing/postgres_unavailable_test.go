package leasing_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/internal/dbtest"
	"github.com/leasestore/leasestore/leasing"
)

// TestReadOnlyConnectionsAreDiscarded is a pool whose connections reached
// a server that refuses writes (SQLSTATE 25006), as connections to a
// primary demoted in a failover do: the store discards each connection a
// write was refused on, so once the server accepts writes again the next
// call succeeds without a restart; while it refuses them, calls return
// ErrUnavailable and change nothing.
func TestReadOnlyConnectionsAreDiscarded(t *testing.T) {
	ctx := context.Background()
	url := dbtest.DatabaseURL(t)
	admin, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	defer admin.Close(ctx)
	var dbName string
	require.NoError(t, admin.QueryRow(ctx, "SELECT current_database()").Scan(&dbName))
	readOnly := func(on bool) {
		stmt := "ALTER DATABASE " + pgx.Identifier{dbName}.Sanitize() + " RESET default_transaction_read_only"
		if on {
			stmt = "ALTER DATABASE " + pgx.Identifier{dbName}.Sanitize() + " SET default_transaction_read_only = on"
		}
		_, err := admin.Exec(ctx, stmt)
		require.NoError(t, err)
	}

	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	cfg.MaxConns = 3
	cfg.MinConns = 0
	readOnly(true)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer pool.Close()
	store, err := leasing.NewPostgres(pool, leasing.Inbox, leasing.PostgresOptions{})
	require.NoError(t, err)
	require.NoError(t, store.CheckSchema(ctx))
	// fill fills the pool with sessions opened now.
	fill := func() {
		conns := make([]*pgxpool.Conn, cfg.MaxConns)
		for i := range conns {
			conns[i], err = pool.Acquire(ctx)
			require.NoError(t, err)
		}
		for _, c := range conns {
			c.Release()
		}
	}
	total := func() int64 {
		st, err := store.Stats(ctx) // reads work on a read-only server
		require.NoError(t, err)
		var n int64
		for _, d := range st.Depth {
			n += d
		}
		return n
	}
	fill()
	_, err = store.Enqueue(ctx, leasing.NewMessage{Type: "refused"})
	require.ErrorIs(t, err, leasing.ErrUnavailable)
	require.Zero(t, total())

	// The server accepts writes again; sessions opened before keep
	// refusing them, so only discarding them lets the store recover: the
	// pool holds fewer sessions than a call's tries.
	fill()
	readOnly(false)
	for range 2 {
		_, err = store.Enqueue(ctx, leasing.NewMessage{Type: "accepted"})
		require.NoError(t, err)
	}
	require.Equal(t, int64(2), total())
}
