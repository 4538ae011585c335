package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/integration/dbtest"
	"github.com/leasestore/leasestore/internal/doctor"
	"github.com/leasestore/leasestore/leasing"
)

func TestDoctor(t *testing.T) {
	t.Parallel()

	t.Run("Check/HealthyDatabase", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		pool := dbtest.NewPool(t)
		store, err := leasing.NewPostgres(pool, leasing.Inbox, leasing.PostgresOptions{})
		require.NoError(t, err)
		_, err = store.Enqueue(ctx, make([]leasing.NewMessage, 20)...)
		require.NoError(t, err)

		rep, err := doctor.Check(ctx, pool, doctor.Options{})
		require.NoError(t, err)
		require.Len(t, rep.Queues, 2)
		for _, q := range rep.Queues {
			require.Empty(t, q.Problems, q.Queue)
		}
		// The server may run with autovacuum off (some test servers do);
		// that is the one server-wide problem a fresh database can have.
		require.Equal(t, rep.Autovacuum, rep.OK, rep.Problems)
		in := rep.Queues[0]
		require.Equal(t, "inbox_messages", in.Table)
		require.Equal(t, 10, in.ClaimRows)
		require.Positive(t, in.ClaimBuffers)
		require.Contains(t, in.ClaimIndexes, "inbox_messages_ready_idx")
		require.Contains(t, in.ClaimIndexes, "inbox_messages_inflight_idx")
		require.Len(t, in.Indexes, 10)
		require.True(t, in.MayVacuum, "the test user owns the tables")
		for _, ix := range in.Indexes {
			require.True(t, ix.Present && ix.Valid, ix.Name)
		}
		require.Equal(t, int64(20), in.Depth["pending"], "the explained claim was rolled back")

		var out bytes.Buffer
		ok, err := doctor.Run(ctx, pool, &out, true, doctor.Options{})
		require.NoError(t, err)
		require.Equal(t, rep.OK, ok)
		var fields map[string]any
		require.NoError(t, json.Unmarshal(out.Bytes(), &fields))
		q := fields["queues"].([]any)[0].(map[string]any)
		for _, name := range []string{"claim_buffers", "claim_ms", "claim_plan", "expired_leases",
			"oldest_due_seconds", "overdue", "dead_lettered", "may_vacuum", "dead_tuples", "last_autovacuum", "problems"} {
			require.Contains(t, q, name)
		}
		require.Contains(t, fields, "oldest_xact_seconds")
	})

	t.Run("Check/InvalidAndMissingIndexes", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		pool := dbtest.NewPool(t)
		// What an interrupted CREATE INDEX CONCURRENTLY leaves behind.
		_, err := pool.Exec(ctx, `UPDATE pg_index SET indisvalid = false
			WHERE indexrelid = 'inbox_messages_ready_idx'::regclass`)
		require.NoError(t, err)
		_, err = pool.Exec(ctx, `DROP INDEX outbox_messages_inflight_idx`)
		require.NoError(t, err)

		rep, err := doctor.Check(ctx, pool, doctor.Options{})
		require.NoError(t, err)
		require.False(t, rep.OK)
		require.True(t, hasProblem(rep.Queues[0].Problems, "inbox_messages_ready_idx is invalid"), rep.Queues[0].Problems)
		require.True(t, hasProblem(rep.Queues[1].Problems, "outbox_messages_inflight_idx is missing"), rep.Queues[1].Problems)
		require.True(t, hasProblem(rep.Queues[1].Problems, "does not use index outbox_messages_inflight_idx"), rep.Queues[1].Problems)

		var out bytes.Buffer
		code := doctor.Main(ctx, func(context.Context) (*pgxpool.Pool, error) { return pool, nil }, nil, &out, &out)
		require.Equal(t, 1, code)
		require.Contains(t, out.String(), "REINDEX INDEX CONCURRENTLY inbox_messages_ready_idx")
		require.Contains(t, out.String(), "NOT OK")
	})

	t.Run("Check/OldTransactionAndBacklog", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		url := dbtest.DatabaseURL(t)
		pool, err := pgxpool.New(ctx, url)
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		store, err := leasing.NewPostgres(pool, leasing.Inbox, leasing.PostgresOptions{})
		require.NoError(t, err)
		_, err = store.Enqueue(ctx, leasing.NewMessage{})
		require.NoError(t, err)
		_, err = store.Claim(ctx, leasing.ClaimRequest{Owner: "gone", BatchSize: 1, LeaseFor: time.Millisecond})
		require.NoError(t, err)
		_, err = store.Enqueue(ctx, leasing.NewMessage{})
		require.NoError(t, err)

		// A repeatable-read transaction keeps its snapshot, and with it
		// backend_xmin, until it ends.
		holder, err := pgx.Connect(ctx, url)
		require.NoError(t, err)
		t.Cleanup(func() { _ = holder.Close(ctx) })
		tx, err := holder.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
		require.NoError(t, err)
		_, err = tx.Exec(ctx, "SELECT 1")
		require.NoError(t, err)
		time.Sleep(20 * time.Millisecond)

		rep, err := doctor.Check(ctx, pool, doctor.Options{
			Queues: []leasing.Queue{leasing.Inbox}, MaxXactAge: 10 * time.Millisecond, MaxOldestDue: time.Millisecond,
		})
		require.NoError(t, err)
		require.False(t, rep.OK)
		require.Positive(t, rep.OldestXactSeconds)
		require.True(t, hasProblem(rep.Problems, "has held a snapshot"), rep.Problems)
		in := rep.Queues[0]
		require.Equal(t, int64(1), in.ExpiredLeases)
		require.True(t, hasProblem(in.Warnings, "1 lease expired and is not reclaimed yet"), in.Warnings)
		require.True(t, hasProblem(in.Problems, "has been due for more than"), in.Problems)
		require.NoError(t, tx.Rollback(ctx))
	})

	t.Run("Check/ProcessorRoleMayNotVacuum", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		url := dbtest.DatabaseURL(t)
		applyRoles(t, url)
		pool := newPool(t, asUser(t, url, loginRole(t, url, "leasestore_processor")), "leasestore-doctor-role", 2)
		rep, err := doctor.Check(ctx, pool, doctor.Options{Queues: []leasing.Queue{leasing.Outbox}})
		require.NoError(t, err)
		out := rep.Queues[0]
		require.False(t, out.MayVacuum)
		require.True(t, hasProblem(out.Warnings, "may not VACUUM outbox_messages"), out.Warnings)
	})

	t.Run("Check/OverdueCountsOnlyTimeDue", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		pool := dbtest.NewPool(t)
		overdue := func() (bool, []string) {
			rep, err := doctor.Check(ctx, pool, doctor.Options{Queues: []leasing.Queue{leasing.Inbox}})
			require.NoError(t, err)
			return rep.Queues[0].Overdue, rep.Queues[0].Problems
		}
		// The FIFO head was created an hour ago but became due a minute
		// ago (a retry delay): not overdue, however old it is.
		_, err := pool.Exec(ctx, `INSERT INTO inbox_messages (message_id, payload, created_at, visible_after, status, attempt_count)
			VALUES (gen_random_uuid(), '\x01', now() - interval '1 hour', now() - interval '1 minute', 'failed', 1)`)
		require.NoError(t, err)
		got, problems := overdue()
		require.False(t, got, problems)
		require.False(t, hasProblem(problems, "has been due"), problems)

		// A younger row, due for 20 minutes behind it, is overdue.
		_, err = pool.Exec(ctx, `INSERT INTO inbox_messages (message_id, payload, created_at, visible_after)
			VALUES (gen_random_uuid(), '\x01', now() - interval '20 minutes', now() - interval '20 minutes')`)
		require.NoError(t, err)
		got, problems = overdue()
		require.True(t, got)
		require.True(t, hasProblem(problems, "has been due for more than 15m0s"), problems)

		// So is a lease that expired 20 minutes ago, alone.
		_, err = pool.Exec(ctx, `DELETE FROM inbox_messages`)
		require.NoError(t, err)
		_, err = pool.Exec(ctx, `INSERT INTO inbox_messages (message_id, payload, created_at, visible_after, status,
				lease_owner, lease_expires_at, lease_generation, attempt_count)
			VALUES (gen_random_uuid(), '\x01', now() - interval '1 hour', now() - interval '1 hour', 'processing',
				'gone', now() - interval '20 minutes', 1, 1)`)
		require.NoError(t, err)
		got, problems = overdue()
		require.True(t, got, problems)
	})
}

func hasProblem(list []string, part string) bool {
	for _, p := range list {
		if strings.Contains(p, part) {
			return true
		}
	}
	return false
}
