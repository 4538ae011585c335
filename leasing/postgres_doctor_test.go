package leasing_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/internal/dbtest"
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
		require.Len(t, in.Indexes, 12)
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

	t.Run("Check/RetainedWindow", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		pool := dbtest.NewPool(t)
		store, err := leasing.NewPostgres(pool, leasing.Inbox, leasing.PostgresOptions{})
		require.NoError(t, err)
		_, err = store.Enqueue(ctx, leasing.NewMessage{Type: "t", Payload: []byte("x")})
		require.NoError(t, err)
		leases, err := store.Claim(ctx, leasing.ClaimRequest{Owner: "w", BatchSize: 1, LeaseFor: time.Minute})
		require.NoError(t, err)
		_, err = store.Complete(ctx, leases...)
		require.NoError(t, err)
		_, err = pool.Exec(ctx, "UPDATE inbox_messages SET completed_at = now() - interval '3 hours'")
		require.NoError(t, err)

		rep, err := doctor.Check(ctx, pool, doctor.Options{Queues: []leasing.Queue{leasing.Inbox}})
		require.NoError(t, err)
		require.InDelta(t, (3 * time.Hour).Seconds(), rep.Queues[0].RetainedSeconds, 60)
		require.Zero(t, rep.Queues[0].RetainedDeadSeconds)
		var out bytes.Buffer
		_, err = doctor.Run(ctx, pool, &out, false, doctor.Options{Queues: []leasing.Queue{leasing.Inbox}})
		require.NoError(t, err)
		require.Contains(t, out.String(), "dedup window (finished rows kept) 3h")
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
		revokeMaintain(t, url)
		pool := newPool(t, asUser(t, url, loginRole(t, url, "leasestore_processor")), "leasestore-doctor-role", 2)
		rep, err := doctor.Check(ctx, pool, doctor.Options{Queues: []leasing.Queue{leasing.Outbox}})
		require.NoError(t, err)
		out := rep.Queues[0]
		require.False(t, out.MayVacuum)
		require.NotNil(t, out.Keys)
		require.False(t, out.Keys.MayVacuum)
		require.True(t, hasProblem(out.Warnings, "may not VACUUM outbox_messages and outbox_ordering_keys:"), out.Warnings)
	})

	t.Run("Check/KeyTableMayNotVacuum", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		url := dbtest.DatabaseURL(t)
		applyRoles(t, url)
		revokeMaintain(t, url)
		// The role owns the queue's table, not its keys' table: the
		// vacuum policy, which needs both, vacuums neither.
		owner := tableOwner(t, url, "leasestore_processor", leasing.Inbox.Table())
		pool := newPool(t, asUser(t, url, loginRole(t, url, owner)), "leasestore-doctor-keys-role", 2)
		rep, err := doctor.Check(ctx, pool, doctor.Options{Queues: []leasing.Queue{leasing.Inbox}})
		require.NoError(t, err)
		in := rep.Queues[0]
		require.True(t, in.MayVacuum)
		require.NotNil(t, in.Keys)
		require.Equal(t, "inbox_ordering_keys", in.Keys.Table)
		require.False(t, in.Keys.MayVacuum)
		require.True(t, hasProblem(in.Warnings, "may not VACUUM inbox_ordering_keys: processors connecting as it leave inbox_messages and inbox_ordering_keys to autovacuum"), in.Warnings)
		require.False(t, hasProblem(in.Warnings, "may not VACUUM inbox_messages"), in.Warnings)
		require.Empty(t, in.Problems)

		var out bytes.Buffer
		require.NoError(t, doctor.WriteText(&out, rep))
		require.Contains(t, out.String(), "inbox_ordering_keys: dead tuples 0 (live 0), last autovacuum never, last vacuum never, this role may vacuum false\n")
	})

	t.Run("Check/KeyTableDeadRows", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		url := dbtest.DatabaseURL(t)
		pool := newPool(t, url, "leasestore-doctor-keys-churn", 1)
		keys := leasing.Inbox.KeyTable()
		// Autovacuum (when the server runs it) would take the count away
		// between the reads below.
		_, err := pool.Exec(ctx, "ALTER TABLE "+keys+" SET (autovacuum_enabled = false)")
		require.NoError(t, err)
		store, err := leasing.NewPostgres(pool, leasing.Inbox, leasing.PostgresOptions{})
		require.NoError(t, err)
		// A keyed drain: each finished head moves its key row on, the last
		// message of a key deletes it.
		_, err = store.Enqueue(ctx, keyedMessages(200, 10)...)
		require.NoError(t, err)
		finishAll(t, pool, store)
		dead := tableHealth(t, pool, keys).DeadTuples
		require.Greater(t, dead, int64(1))

		check := func(maxDead int64) doctor.QueueReport {
			rep, err := doctor.Check(ctx, pool, doctor.Options{Queues: []leasing.Queue{leasing.Inbox}, MaxDeadTuples: maxDead})
			require.NoError(t, err)
			return rep.Queues[0]
		}
		in := check(dead)
		require.NotNil(t, in.Keys)
		require.Equal(t, dead, in.Keys.DeadTuples)
		require.True(t, in.Keys.MayVacuum)
		require.False(t, hasProblem(in.Problems, keys+" holds"), "%d dead rows are not more than %d: %v", dead, dead, in.Problems)
		require.True(t, hasProblem(in.Problems, "autovacuum is turned off for "+keys), in.Problems)
		in = check(dead - 1)
		require.True(t, hasProblem(in.Problems, fmt.Sprintf("%s holds %d dead row versions (more than %d)", keys, dead, dead-1)), in.Problems)
	})

	t.Run("Check/WorkSignalGrant", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		url := dbtest.DatabaseURL(t)
		applyRoles(t, url)
		role := loginRole(t, url, "leasestore_processor")
		// A restore without privileges: the inbox's sequence has lost its
		// grants, the outbox's keeps those of migration 00014 and
		// db/roles.sql.
		_, err := adminConn(t, url).Exec(ctx, "REVOKE SELECT ON SEQUENCE inbox_messages_work_signal FROM PUBLIC, leasestore_processor")
		require.NoError(t, err)
		// Run as the producer's role, and as the tables' owner (who may
		// read the sequence itself), doctor names the roles that may insert
		// but not read the sequence.
		for name, pool := range map[string]*pgxpool.Pool{
			"producer": newPool(t, asUser(t, url, role), "leasestore-doctor-signal", 2),
			"owner":    newPool(t, url, "leasestore-doctor-signal-owner", 2),
		} {
			rep, err := doctor.Check(ctx, pool, doctor.Options{})
			require.NoError(t, err, name)
			in, out := rep.Queues[0], rep.Queues[1]
			require.Equal(t, "inbox_messages_work_signal", in.Signal.Sequence, name)
			require.True(t, in.Signal.Gated, name)
			require.Equal(t, name == "owner", in.Signal.MaySelect, name)
			require.Subset(t, in.Signal.RolesWithoutSelect, []string{role, "leasestore_processor"}, name)
			require.True(t, hasProblem(in.Warnings, "may insert into inbox_messages but not SELECT the work signal's sequence inbox_messages_work_signal"), in.Warnings)
			require.True(t, hasProblem(in.Warnings, "GRANT SELECT ON SEQUENCE inbox_messages_work_signal TO "), in.Warnings)
			require.True(t, hasProblem(in.Warnings, role), in.Warnings)
			require.Equal(t, &doctor.SignalState{Sequence: "outbox_messages_work_signal", Gated: true, MaySelect: true, RolesWithoutSelect: []string{}}, out.Signal, name)
			require.False(t, hasProblem(out.Warnings, "work signal"), out.Warnings)
		}
	})

	t.Run("Check/WorkSignalBefore00014", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		url := migratedTo(t, 13).Config().ConnString()
		applyRoles(t, url)
		role := loginRole(t, url, "leasestore_processor")
		_, err := adminConn(t, url).Exec(ctx, "REVOKE SELECT ON SEQUENCE inbox_messages_work_signal FROM PUBLIC, leasestore_processor")
		require.NoError(t, err)
		// 00009's trigger calls its function on every inserting statement,
		// whatever the role may read: nothing to warn about.
		pool := newPool(t, asUser(t, url, role), "leasestore-doctor-signal-13", 2)
		rep, err := doctor.Check(ctx, pool, doctor.Options{Queues: []leasing.Queue{leasing.Inbox}})
		require.NoError(t, err)
		in := rep.Queues[0]
		require.Equal(t, "inbox_messages_work_signal", in.Signal.Sequence)
		require.False(t, in.Signal.Gated)
		require.False(t, in.Signal.MaySelect)
		require.Contains(t, in.Signal.RolesWithoutSelect, role)
		require.False(t, hasProblem(in.Warnings, "work signal"), in.Warnings)
	})

	t.Run("Check/MissingPrivileges", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		url := dbtest.DatabaseURL(t)
		// A role granted the queue table by hand, without db/roles.sql:
		// nothing on the ordering keys' table or the queue settings.
		role := grantedRole(t, url, "SELECT, INSERT, UPDATE ON inbox_messages")
		admin := adminConn(t, url)
		// The checks that need no table privilege are still made.
		_, err := admin.Exec(ctx, "ALTER TABLE inbox_messages SET (autovacuum_enabled = false)")
		require.NoError(t, err)
		pool := newPool(t, asUser(t, url, role), "leasestore-doctor-privileges", 2)
		var js bytes.Buffer
		ok, err := doctor.Run(ctx, pool, &js, true, doctor.Options{Queues: []leasing.Queue{leasing.Inbox}})
		require.NoError(t, err, "missing privileges are a problem in the report, not an error")
		require.False(t, ok)
		var rep doctor.Report
		require.NoError(t, json.Unmarshal(js.Bytes(), &rep))
		in := rep.Queues[0]
		require.True(t, hasProblem(in.Problems, "this role may not run every statement a processor sends: claim (permission denied for table leasestore_paused), free ordering keys (permission denied for table inbox_ordering_keys); a processor connecting as it claims nothing"), in.Problems)
		require.False(t, hasProblem(in.Problems, "INSERT"), "processors need no INSERT: %v", in.Problems)
		// The text output still shows the tables' state and the signal.
		var text bytes.Buffer
		require.NoError(t, doctor.WriteText(&text, rep))
		require.Contains(t, text.String(), "\n  dead tuples 0 (live 0), last autovacuum never")
		require.Contains(t, text.String(), "\n  inbox_ordering_keys: dead tuples 0 (live 0)")
		require.Contains(t, text.String(), "\n  work signal: sequence inbox_messages_work_signal, read by the insert trigger's WHEN clause true, this role may read it ")
		require.False(t, hasProblem(in.Problems, "on inbox_messages"), in.Problems)
		require.True(t, hasProblem(in.Problems, "autovacuum is turned off for inbox_messages"), in.Problems)
	})

	t.Run("Check/StatementsDoNotFitTheSchema", func(t *testing.T) {
		// Every migration applied, but the ordering keys' table dropped by
		// hand: the processors' statements fail, a problem in the report.
		t.Parallel()
		ctx := t.Context()
		url := dbtest.DatabaseURL(t)
		_, err := adminConn(t, url).Exec(ctx, "DROP TABLE inbox_ordering_keys")
		require.NoError(t, err)
		rep, err := doctor.Check(ctx, newPool(t, url, "leasestore-doctor-no-keys", 2), doctor.Options{Queues: []leasing.Queue{leasing.Inbox}})
		require.NoError(t, err)
		in := rep.Queues[0]
		require.True(t, hasProblem(in.Problems, `a processor's statements do not fit this schema: ERROR: relation "inbox_ordering_keys" does not exist (SQLSTATE 42P01); run leasectl migrate up`), in.Problems)
		require.False(t, hasProblem(in.Warnings, "were not checked"), in.Warnings)
	})

	t.Run("Check/HeadParkedKeyNotFreed", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		url := dbtest.DatabaseURL(t)
		pool := newPool(t, url, "leasestore-doctor-parked-head", 2)
		store, err := leasing.NewPostgres(pool, leasing.Inbox, leasing.PostgresOptions{})
		require.NoError(t, err)
		res, err := store.Enqueue(ctx, leasing.NewMessage{OrderingKey: "k"}, leasing.NewMessage{OrderingKey: "k"})
		require.NoError(t, err)
		head := res.IDs[0]
		check := func() doctor.QueueReport {
			rep, err := doctor.Check(ctx, pool, doctor.Options{Queues: []leasing.Queue{leasing.Inbox}, MaxOldestDue: time.Microsecond})
			require.NoError(t, err)
			return rep.Queues[0]
		}
		require.True(t, hasProblem(check().Warnings, "no processor has claimed the head (it is pending)"))
		// What a claim leaves when it parked the head and freeing its key
		// failed (ParkedError.KeysNotFreed): the head dead-lettered, still
		// its key's head.
		_, err = pool.Exec(ctx, `UPDATE inbox_messages SET status = 'dead_lettered', dead_lettered_at = now(),
		                         last_error = 'parked by the claim: headers are a JSON array, not an object' WHERE message_id = $1`, head)
		require.NoError(t, err)
		in := check()
		require.True(t, hasProblem(in.Warnings, "the head was parked by the claim and its key was not freed: fix the row, then requeue it, or purge it"), in.Warnings)
		_, err = pool.Exec(ctx, `UPDATE inbox_messages SET last_error = 'broker down' WHERE message_id = $1`, head)
		require.NoError(t, err)
		in = check()
		require.True(t, hasProblem(in.Warnings, "the head is dead-lettered but still holds its key"), in.Warnings)
		require.NoError(t, store.SetStrictOrdering(ctx, true))
		in = check()
		require.True(t, hasProblem(in.Warnings, "the head is dead-lettered and holds its key (strict ordering)"), in.Warnings)
		// A parked row Get cannot read (an infinite time): the causes a
		// dead letter can have.
		_, err = pool.Exec(ctx, `UPDATE inbox_messages SET created_at = '-infinity' WHERE message_id = $1`, head)
		require.NoError(t, err)
		in = check()
		require.True(t, hasProblem(in.Warnings, "a dead-lettered head, under strict ordering or parked by the claim (its row could not be read"), in.Warnings)
	})

	t.Run("Check/Before00010", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		pool := migratedTo(t, 9)
		rep, err := doctor.Check(ctx, pool, doctor.Options{})
		require.NoError(t, err)
		require.True(t, hasProblem(rep.Problems, "migrations not applied: 00010_ordering_keys"), rep.Problems)
		for _, q := range rep.Queues {
			require.Nil(t, q.Keys, q.Queue)
			require.NotNil(t, q.Signal, q.Queue)
			require.False(t, q.Signal.Gated, q.Queue)
			keys := string(q.Queue) + "_ordering_keys"
			require.False(t, hasProblem(q.Problems, keys), q.Problems)
			require.False(t, hasProblem(q.Warnings, keys), q.Warnings)
			require.False(t, hasProblem(q.Warnings, "work signal"), q.Warnings)
		}
		var out bytes.Buffer
		require.NoError(t, doctor.WriteText(&out, rep))
		require.NotContains(t, out.String(), "inbox_ordering_keys")
		require.NotContains(t, out.String(), "outbox_ordering_keys")
		var js bytes.Buffer
		_, err = doctor.Run(ctx, pool, &js, true, doctor.Options{})
		require.NoError(t, err)
		require.NotContains(t, js.String(), `"keys"`)
	})

	t.Run("Check/Pauses", func(t *testing.T) {
		t.Parallel()
		ctx := t.Context()
		pool := dbtest.NewPool(t)
		store, err := leasing.NewPostgres(pool, leasing.Inbox, leasing.PostgresOptions{})
		require.NoError(t, err)
		check := func() doctor.QueueReport {
			rep, err := doctor.Check(ctx, pool, doctor.Options{Queues: []leasing.Queue{leasing.Inbox}})
			require.NoError(t, err)
			return rep.Queues[0]
		}
		// A message due for 20 minutes: overdue, a problem, while nothing
		// is paused.
		_, err = pool.Exec(ctx, `INSERT INTO inbox_messages (message_id, message_type, payload, created_at, visible_after)
			VALUES (gen_random_uuid(), 'orders', '\x01', now() - interval '20 minutes', now() - interval '20 minutes')`)
		require.NoError(t, err)
		q := check()
		require.Empty(t, q.Paused)
		require.True(t, hasProblem(q.Problems, "has been due for more than"), q.Problems)

		// A paused topic is shown, and is neither problem nor warning.
		require.NoError(t, store.Pause(ctx, leasing.PauseRequest{Topics: []string{"refunds"}, By: "ops@a"}))
		q = check()
		require.Len(t, q.Paused, 1)
		require.Equal(t, "refunds", q.Paused[0].Topic)
		require.Equal(t, "ops@a", q.Paused[0].By)
		require.False(t, hasProblem(q.Warnings, "paused"), q.Warnings)

		// The whole queue paused with a message due: a warning, and the
		// overdue message is no longer a problem.
		require.NoError(t, store.Pause(ctx, leasing.PauseRequest{WholeQueue: true, By: "ops@b"}))
		q = check()
		require.True(t, q.Overdue)
		require.Empty(t, q.Problems)
		require.True(t, hasProblem(q.Warnings, "the whole queue is paused (by ops@b"), q.Warnings)
		require.Equal(t, []string{"", "refunds"}, []string{q.Paused[0].Topic, q.Paused[1].Topic})

		var out bytes.Buffer
		_, err = doctor.Run(ctx, pool, &out, false, doctor.Options{Queues: []leasing.Queue{leasing.Inbox}})
		require.NoError(t, err)
		require.Contains(t, out.String(), "paused: whole queue by ops@b at ")
		require.Contains(t, out.String(), `paused: topic "refunds" by ops@a at `)
		out.Reset()
		_, err = doctor.Run(ctx, pool, &out, true, doctor.Options{Queues: []leasing.Queue{leasing.Inbox}})
		require.NoError(t, err)
		var fields struct {
			Queues []struct {
				Paused []map[string]any `json:"paused"`
			} `json:"queues"`
		}
		require.NoError(t, json.Unmarshal(out.Bytes(), &fields))
		require.Equal(t, "ops@b", fields.Queues[0].Paused[0]["by"])
		require.Contains(t, fields.Queues[0].Paused[0], "at")

		// Nothing due: the whole-queue pause alone warns of nothing.
		_, err = pool.Exec(ctx, `DELETE FROM inbox_messages`)
		require.NoError(t, err)
		q = check()
		require.False(t, hasProblem(q.Warnings, "paused"), q.Warnings)
		require.Len(t, q.Paused, 2)
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

// tableOwner creates a NOLOGIN role in group, unique to this test, and
// makes it the owner of tables; when the test ends, after the login roles
// in it are dropped and before the database is, the tables go back to the
// connecting user and the role is dropped. Returns the role's name.
func tableOwner(t *testing.T, url, group string, tables ...string) string {
	t.Helper()
	name := dbtest.RoleName(t)
	owner := pgx.Identifier{name}.Sanitize()
	var undo []string
	for _, table := range tables {
		undo = append(undo, "ALTER TABLE "+pgx.Identifier{table}.Sanitize()+" OWNER TO CURRENT_USER")
	}
	execAtEnd(t, url, append(undo, "DROP ROLE IF EXISTS "+owner)...)
	admin := adminConn(t, url)
	stmts := []string{"CREATE ROLE " + owner + " NOLOGIN IN ROLE " + pgx.Identifier{group}.Sanitize()}
	for _, table := range tables {
		stmts = append(stmts, "ALTER TABLE "+pgx.Identifier{table}.Sanitize()+" OWNER TO "+owner)
	}
	for _, stmt := range stmts {
		_, err := admin.Exec(context.Background(), stmt)
		require.NoError(t, err, stmt)
	}
	return name
}

func hasProblem(list []string, part string) bool {
	for _, p := range list {
		if strings.Contains(p, part) {
			return true
		}
	}
	return false
}
