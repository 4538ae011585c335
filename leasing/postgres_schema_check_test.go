package leasing_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/db"
	"github.com/leasestore/leasestore/internal/dbtest"
	"github.com/leasestore/leasestore/internal/doctor"
	"github.com/leasestore/leasestore/leasing"
)

// migratedTo returns a pool on a fresh database migrated up to version.
func migratedTo(t *testing.T, version int64) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(t.Context(), dbtest.NewEmptyDatabase(t))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	provider, sqlDB, err := db.NewMigrator(pool)
	require.NoError(t, err)
	defer sqlDB.Close()
	_, err = provider.UpTo(t.Context(), version)
	require.NoError(t, err)
	return pool
}

// schemaErr returns err as a *leasing.SchemaError, failing the test when it
// is none.
func schemaErr(t *testing.T, err error) *leasing.SchemaError {
	t.Helper()
	var se *leasing.SchemaError
	require.ErrorAs(t, err, &se)
	require.ErrorIs(t, err, leasing.ErrSchema)
	return se
}

// requireAfter4 checks that every name is a migration after 00004 and that
// 00005 comes first: the migrations a database at version 4 lacks,
// whatever later versions add.
func requireAfter4(t *testing.T, names []string) {
	t.Helper()
	require.NotEmpty(t, names)
	require.Equal(t, "00005_lease_expiry_idx", names[0])
	for _, n := range names {
		require.Greater(t, n, "00005", n)
	}
}

// TestSchemaCheck: a store of this version refuses to claim on a database
// that lacks a migration or an index it needs, with a *leasing.SchemaError
// naming them, changes nothing then, and claims once the schema is
// complete; a schema newer than the code is fine.
func TestSchemaCheck(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	req := leasing.ClaimRequest{Owner: "w", BatchSize: 10, LeaseFor: time.Minute}

	t.Run("MigratedTo4", func(t *testing.T) {
		t.Parallel()
		pool := migratedTo(t, 4)
		for _, q := range queuesBoth {
			store, err := leasing.NewPostgres(pool, q, leasing.PostgresOptions{})
			require.NoError(t, err)
			se := schemaErr(t, store.CheckSchema(ctx))
			requireAfter4(t, se.Migrations)
			require.False(t, se.NoHistory)
			require.Contains(t, se.MissingIndexes, q.Table()+"_expiry_idx")
			require.Empty(t, se.InvalidIndexes)
			require.Contains(t, se.Error(), "00005_lease_expiry_idx")
			require.Contains(t, se.Error(), "leasectl migrate up")

			// Enqueue does not check; the first claim does, and runs nothing.
			_, err = store.Enqueue(ctx, leasing.NewMessage{Payload: []byte("x")})
			require.NoError(t, err)
			leases, err := store.Claim(ctx, req)
			require.Empty(t, leases)
			se = schemaErr(t, err)
			require.Equal(t, "00005_lease_expiry_idx", se.Migrations[0])
			_, _, err = store.CompleteAndClaim(ctx, nil, req)
			schemaErr(t, err)
			// Operator calls and reads that need the new columns or indexes
			// are refused the same way, before they send anything.
			_, err = store.List(ctx, leasing.ListRequest{Limit: 1})
			schemaErr(t, err)
			_, err = store.Purge(ctx, leasing.PurgeRequest{OlderThan: time.Hour, BatchSize: 10})
			schemaErr(t, err)
			_, err = store.RequeueAll(ctx)
			schemaErr(t, err)
			_, err = store.DeadLetterByID(ctx, leasing.DeadLetterByIDRequest{ID: uuid.New(), Reason: "r"})
			schemaErr(t, err)
			_, err = store.Stats(ctx)
			require.NoError(t, err, "Stats works on an older schema")
			var pending int
			require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+q.Table()+" WHERE status = 'pending'").Scan(&pending))
			require.Equal(t, 1, pending, "the refused claim ran nothing")
		}

		// Once migrated, the same stores claim: a failed check is repeated.
		inbox, err := leasing.NewPostgres(pool, leasing.Inbox, leasing.PostgresOptions{})
		require.NoError(t, err)
		_, err = inbox.Claim(ctx, req)
		schemaErr(t, err)
		_, err = db.MigrateUp(ctx, pool)
		require.NoError(t, err)
		leases, err := inbox.Claim(ctx, req)
		require.NoError(t, err)
		require.Len(t, leases, 1)
	})

	t.Run("NoHistory", func(t *testing.T) {
		t.Parallel()
		pool, err := pgxpool.New(ctx, dbtest.NewEmptyDatabase(t))
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		se := schemaErr(t, leasing.CheckSchema(ctx, pool))
		require.True(t, se.NoHistory)
		reqs, err := db.Requirements()
		require.NoError(t, err)
		require.Len(t, se.Migrations, len(reqs), "every migration is missing")
		require.Contains(t, se.MissingIndexes, "inbox_messages_pkey")
		// One short line: the lists of every migration and index say
		// nothing more than "never migrated".
		require.Equal(t, "leasing: the database was never migrated (no "+db.VersionTable+
			" table, or an older version's history): run leasectl migrate up (or db.MigrateUp)", se.Error())
	})

	t.Run("InvalidAndMissingIndexes", func(t *testing.T) {
		t.Parallel()
		pool := dbtest.NewPool(t)
		// What an interrupted CREATE INDEX CONCURRENTLY leaves behind.
		_, err := pool.Exec(ctx, `UPDATE pg_index SET indisvalid = false WHERE indexrelid = 'inbox_messages_ready_idx'::regclass`)
		require.NoError(t, err)
		_, err = pool.Exec(ctx, `DROP INDEX outbox_messages_expiry_idx`)
		require.NoError(t, err)

		inbox, err := leasing.NewPostgres(pool, leasing.Inbox, leasing.PostgresOptions{})
		require.NoError(t, err)
		se := schemaErr(t, inbox.CheckSchema(ctx))
		require.Equal(t, []string{"inbox_messages_ready_idx"}, se.InvalidIndexes)
		require.Empty(t, se.MissingIndexes, "the outbox's index is not the inbox store's concern")
		require.Empty(t, se.Migrations)
		require.Contains(t, se.Error(), "REINDEX INDEX CONCURRENTLY")

		outbox, err := leasing.NewPostgres(pool, leasing.Outbox, leasing.PostgresOptions{})
		require.NoError(t, err)
		_, err = outbox.Renew(ctx, time.Minute, leasing.Lease{Queue: leasing.Outbox, Owner: "w", Generation: 1})
		se = schemaErr(t, err)
		require.Equal(t, []string{"outbox_messages_expiry_idx"}, se.MissingIndexes)

		se = schemaErr(t, leasing.CheckSchema(ctx, pool))
		require.Equal(t, []string{"inbox_messages_ready_idx"}, se.InvalidIndexes)
		require.Equal(t, []string{"outbox_messages_expiry_idx"}, se.MissingIndexes)

		// A tool that must run on such a database skips the check.
		skip, err := leasing.NewPostgres(pool, leasing.Inbox, leasing.PostgresOptions{SkipSchemaCheck: true})
		require.NoError(t, err)
		_, err = skip.Claim(ctx, req)
		require.NoError(t, err)
	})

	t.Run("FullyMigratedAndNewer", func(t *testing.T) {
		t.Parallel()
		pool := dbtest.NewPool(t)
		require.NoError(t, leasing.CheckSchema(ctx, pool))
		// A newer version's migration (rolling deploy: old code, new schema).
		_, err := pool.Exec(ctx, "INSERT INTO "+db.VersionTable+" (version_id, is_applied) VALUES (99999, true)")
		require.NoError(t, err)
		for _, q := range queuesBoth {
			store, err := leasing.NewPostgres(pool, q, leasing.PostgresOptions{})
			require.NoError(t, err)
			require.NoError(t, store.CheckSchema(ctx))
			_, err = store.Claim(ctx, req)
			require.NoError(t, err)
		}
		// A migration rolled back (goose's is_applied false row) is missing.
		_, err = pool.Exec(ctx, "INSERT INTO "+db.VersionTable+" (version_id, is_applied) VALUES (5, false)")
		require.NoError(t, err)
		se := schemaErr(t, leasing.CheckSchema(ctx, pool))
		require.Equal(t, []string{"00005_lease_expiry_idx"}, se.Migrations)
	})
}

// TestDoctorReportsMigrations: leasectl doctor lists the migrations this
// version needs and reports the ones a database lacks as a problem, from the
// same list as the store's check.
func TestDoctorReportsMigrations(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	reqs, err := db.Requirements()
	require.NoError(t, err)

	t.Run("MigratedTo4", func(t *testing.T) {
		t.Parallel()
		pool := migratedTo(t, 4)
		rep, err := doctor.Check(ctx, pool, doctor.Options{})
		require.NoError(t, err)
		require.False(t, rep.OK)
		require.True(t, rep.MigrationHistory)
		require.Len(t, rep.Migrations, len(reqs))
		var missing []string
		for _, m := range rep.Migrations {
			if !m.Applied {
				missing = append(missing, m.Name)
			}
		}
		requireAfter4(t, missing)
		require.True(t, hasProblem(rep.Problems, "migrations not applied: 00005_lease_expiry_idx"), rep.Problems)
		require.True(t, hasProblem(rep.Queues[0].Problems, "index inbox_messages_expiry_idx is missing"), rep.Queues[0].Problems)

		var out bytes.Buffer
		code := doctor.Main(ctx, func(context.Context) (*pgxpool.Pool, error) { return pool, nil }, nil, &out, &out)
		require.Equal(t, 1, code)
		require.Contains(t, out.String(), "MISSING 00005_lease_expiry_idx")
		require.Contains(t, out.String(), "NOT OK")
	})

	t.Run("FullyMigrated", func(t *testing.T) {
		t.Parallel()
		pool := dbtest.NewPool(t)
		rep, err := doctor.Check(ctx, pool, doctor.Options{})
		require.NoError(t, err)
		require.True(t, rep.MigrationHistory)
		for _, m := range rep.Migrations {
			require.True(t, m.Applied, m.Name)
		}
		require.False(t, hasProblem(rep.Problems, "migrations"), rep.Problems)
		var out bytes.Buffer
		require.NoError(t, doctor.WriteText(&out, rep))
		require.Contains(t, out.String(), fmt.Sprintf("migrations: all %d applied", len(reqs)))
		require.True(t, strings.Contains(out.String(), "inbox_messages_expiry_idx valid"), out.String())
	})
}

// TestSchemaCheckAsProcessorRole: db/roles.sql gives leasestore_processor
// no access to the migration history, so its stores check the indexes
// alone and claim; doctor run as it says the migrations are unknown.
func TestSchemaCheckAsProcessorRole(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := dbtest.DatabaseURL(t)
	applyRoles(t, url)
	pool := newPool(t, asUser(t, url, loginRole(t, url, "leasestore_processor")), "leasestore-schema-role", 2)
	store, err := leasing.NewPostgres(pool, leasing.Inbox, leasing.PostgresOptions{})
	require.NoError(t, err)
	require.NoError(t, store.CheckSchema(ctx))
	_, err = store.Claim(ctx, leasing.ClaimRequest{Owner: "w", BatchSize: 1, LeaseFor: time.Minute})
	require.NoError(t, err)

	admin := adminConn(t, url)
	_, err = admin.Exec(ctx, `DROP INDEX inbox_messages_expiry_idx`)
	require.NoError(t, err)
	se := schemaErr(t, leasing.CheckSchema(ctx, pool, leasing.Inbox))
	require.Equal(t, []string{"inbox_messages_expiry_idx"}, se.MissingIndexes)
	require.Empty(t, se.Migrations, "the history is not readable: unknown, not missing")

	rep, err := doctor.Check(ctx, pool, doctor.Options{Queues: []leasing.Queue{leasing.Inbox}})
	require.NoError(t, err)
	require.Empty(t, rep.Migrations)
	require.True(t, hasProblem(rep.Warnings, "may not read "+db.VersionTable), rep.Warnings)
	var out bytes.Buffer
	require.NoError(t, doctor.WriteText(&out, rep))
	require.Contains(t, out.String(), "migrations: unknown")
}
