package integration

import (
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pressly/goose/v3"
	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/db"
	"github.com/leasestore/leasestore/integration/dbtest"
)

func TestMigrate(t *testing.T) {
	t.Parallel()

	ctx := t.Context()
	pool, err := pgxpool.New(ctx, dbtest.NewEmptyDatabase(t))
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	provider, sqlDB, err := db.NewMigrator(pool)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sqlDB.Close() })
	sources := provider.ListSources()
	latest := sources[len(sources)-1].Version

	_, err = provider.Up(ctx)
	require.NoError(t, err)
	requireSchema(t, pool)

	_, err = provider.DownTo(ctx, 0)
	require.NoError(t, err)
	rows, err := pool.Query(ctx, `
		SELECT c.relname FROM pg_class AS c
		JOIN pg_namespace AS n ON n.oid = c.relnamespace
		WHERE n.nspname = 'public' AND c.relname NOT LIKE 'goose_db_version%'
		UNION ALL
		SELECT p.proname FROM pg_proc AS p
		JOIN pg_namespace AS n ON n.oid = p.pronamespace
		WHERE n.nspname = 'public'`)
	require.NoError(t, err)
	leftovers, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Empty(t, leftovers, "relations and functions left after down to 0")

	for {
		_, err := provider.UpByOne(ctx)
		if errors.Is(err, goose.ErrNoNextVersion) {
			break
		}
		require.NoError(t, err)
	}
	version, err := provider.GetDBVersion(ctx)
	require.NoError(t, err)
	require.Equal(t, latest, version)
	requireSchema(t, pool)

	t.Run("Insert/DefaultsArePendingAndDue", func(t *testing.T) {
		for _, table := range []string{"inbox_messages", "outbox_messages"} {
			var id string
			err := pool.QueryRow(ctx, "INSERT INTO "+pgx.Identifier{table}.Sanitize()+
				` (message_id, payload) VALUES (gen_random_uuid(), '\x01') RETURNING message_id::text`).Scan(&id)
			require.NoError(t, err, table)

			// A later statement, so that now() is past the insert's clock_timestamp().
			var status string
			var due, leased bool
			var generation, attempts int64
			err = pool.QueryRow(ctx, "SELECT status, visible_after <= now(), lease_owner IS NOT NULL OR lease_expires_at IS NOT NULL, "+
				"lease_generation, attempt_count FROM "+pgx.Identifier{table}.Sanitize()+" WHERE message_id = $1::uuid", id).
				Scan(&status, &due, &leased, &generation, &attempts)
			require.NoError(t, err, table)
			require.Equal(t, "pending", status, table)
			require.True(t, due, table)
			require.False(t, leased, table)
			require.Zero(t, generation, table)
			require.Zero(t, attempts, table)
		}
	})

	t.Run("Insert/InFlightWithoutLeaseIsRejected", func(t *testing.T) {
		for table, inFlight := range map[string]string{"inbox_messages": "processing", "outbox_messages": "publishing"} {
			_, err := pool.Exec(ctx, "INSERT INTO "+pgx.Identifier{table}.Sanitize()+
				` (message_id, payload, status) VALUES (gen_random_uuid(), '\x01', $1)`, inFlight)
			var pgErr *pgconn.PgError
			require.ErrorAs(t, err, &pgErr, table)
			require.Equal(t, "23514", pgErr.Code, table) // check_violation
			require.Equal(t, table+"_lease_check", pgErr.ConstraintName)
		}
	})
}

// requireSchema asserts that the claim and idempotency indexes exist and
// that every index on the two tables is valid and ready.
func requireSchema(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	type index struct {
		Name  string
		Valid bool
		Ready bool
	}
	rows, err := pool.Query(t.Context(), `
		SELECT c.relname, i.indisvalid, i.indisready
		FROM pg_index AS i
		JOIN pg_class AS c ON c.oid = i.indexrelid
		WHERE i.indrelid IN ('inbox_messages'::regclass, 'outbox_messages'::regclass)
		ORDER BY c.relname`)
	require.NoError(t, err)
	indexes, err := pgx.CollectRows(rows, pgx.RowToStructByPos[index])
	require.NoError(t, err)

	names := make([]string, 0, len(indexes))
	for _, ix := range indexes {
		require.True(t, ix.Valid && ix.Ready, "index %s is not valid", ix.Name)
		names = append(names, ix.Name)
	}
	require.Subset(t, names, []string{
		"inbox_messages_ready_idx",
		"inbox_messages_inflight_idx",
		"inbox_messages_idempotency_key_idx",
		"outbox_messages_ready_idx",
		"outbox_messages_inflight_idx",
		"inbox_messages_tenant_ready_idx",
		"inbox_messages_tenant_inflight_idx",
		"outbox_messages_tenant_ready_idx",
		"outbox_messages_tenant_inflight_idx",
		"inbox_messages_expiry_idx",
		"outbox_messages_expiry_idx",
	})
}
