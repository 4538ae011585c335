package leasing_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/gen"
	"github.com/leasestore/leasestore/internal/dbtest"
)

// seedClaimSQL is the seed's claim: one OR over the three eligibility
// branches, FIFO by (created_at, message_id), FOR UPDATE SKIP LOCKED, LIMIT n.
// %[1]s is the table, %[2]s its in-flight status. $1 now, $2 tenant, $3 n.
const seedClaimSQL = `
WITH picked AS (
    SELECT message_id
    FROM %[1]s
    WHERE ((status IN ('pending', 'failed') AND visible_after <= $1::timestamptz)
           OR (status = '%[2]s' AND lease_expires_at <= $1::timestamptz))
      AND ($2::text IS NULL OR tenant_id = $2::text)
    ORDER BY created_at, message_id
    LIMIT $3::integer
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE %[1]s AS m
    SET status = '%[2]s', lease_owner = 'seed', lease_expires_at = $1::timestamptz + interval '30 seconds',
        lease_generation = m.lease_generation + 1, attempt_count = m.attempt_count + 1,
        last_attempted_at = $1::timestamptz
    FROM picked
    WHERE m.message_id = picked.message_id
    RETURNING m.message_id, m.created_at
)
SELECT message_id FROM claimed ORDER BY created_at, message_id`

// equivQueue is one table under the equivalence test.
type equivQueue struct {
	name, table, inFlight, success, doneAt string
	claim                                  func(context.Context, gen.DBTX, *time.Time, *string, int32) ([]uuid.UUID, error)
}

var equivQueues = []equivQueue{
	{"InboxClaim", "inbox_messages", "processing", "completed", "completed_at",
		func(ctx context.Context, db gen.DBTX, now *time.Time, tenant *string, n int32) ([]uuid.UUID, error) {
			if tenant != nil {
				rows, err := gen.New().InboxClaimTenant(ctx, db, gen.InboxClaimTenantParams{
					Now: now, TenantID: *tenant, BatchSize: n, LeaseOwner: "ours", LeaseFor: 30 * time.Second,
				})
				ids := make([]uuid.UUID, len(rows))
				for i, r := range rows {
					ids[i] = r.MessageID
				}
				return ids, err
			}
			rows, err := gen.New().InboxClaim(ctx, db, gen.InboxClaimParams{
				Now: now, BatchSize: n, LeaseOwner: "ours", LeaseFor: 30 * time.Second,
			})
			ids := make([]uuid.UUID, len(rows))
			for i, r := range rows {
				ids[i] = r.MessageID
			}
			return ids, err
		}},
	{"OutboxClaim", "outbox_messages", "publishing", "published", "published_at",
		func(ctx context.Context, db gen.DBTX, now *time.Time, tenant *string, n int32) ([]uuid.UUID, error) {
			if tenant != nil {
				rows, err := gen.New().OutboxClaimTenant(ctx, db, gen.OutboxClaimTenantParams{
					Now: now, TenantID: *tenant, BatchSize: n, LeaseOwner: "ours", LeaseFor: 30 * time.Second,
				})
				ids := make([]uuid.UUID, len(rows))
				for i, r := range rows {
					ids[i] = r.MessageID
				}
				return ids, err
			}
			rows, err := gen.New().OutboxClaim(ctx, db, gen.OutboxClaimParams{
				Now: now, BatchSize: n, LeaseOwner: "ours", LeaseFor: 30 * time.Second,
			})
			ids := make([]uuid.UUID, len(rows))
			for i, r := range rows {
				ids[i] = r.MessageID
			}
			return ids, err
		}},
}

// TestClaimEquivalence runs the seed's claim and the generated claim on the
// same randomized tables, each in a transaction it rolls back, and requires
// the same ids in the same order: for many seeds, batch sizes, tenants, with
// some rows locked by another session, with many, one or no expired leases,
// and under three planner settings (default, no sequential scan or sort,
// generic plans).
func TestClaimEquivalence(t *testing.T) {
	t.Parallel()
	const seeds = 16
	batches := []int32{1, 2, 3, 7, 10, 50, 1000}
	tenants := []*string{nil, ptr("a"), ptr("b"), ptr("absent")}
	modes := []string{
		"",
		"SET LOCAL enable_seqscan = off; SET LOCAL enable_sort = off; SET LOCAL enable_bitmapscan = off",
		"SET LOCAL plan_cache_mode = force_generic_plan",
	}
	now := time.Date(2024, 1, 1, 12, 0, 0, 0, time.UTC)

	for _, q := range equivQueues {
		t.Run(q.name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			pool := dbtest.NewPool(t)
			seedSQL := fmt.Sprintf(seedClaimSQL, pgx.Identifier{q.table}.Sanitize(), q.inFlight)
			conn, err := pool.Acquire(ctx)
			require.NoError(t, err)
			defer conn.Release()
			locker, err := pool.Acquire(ctx)
			require.NoError(t, err)
			defer locker.Release()

			for seed := range uint64(seeds) {
				rng := rand.New(rand.NewPCG(seed, 0x5eed))
				ids := loadRandomRows(t, conn.Conn(), q, rng, now)
				// Seeds 2 and 3 mod 4: no lease has expired, so the
				// expired branch's probe is false; 3 mod 4 then expires
				// exactly one lease (locked by the other session when it
				// falls in the locked tenth).
				if seed%4 >= 2 {
					table := pgx.Identifier{q.table}.Sanitize()
					_, err := conn.Exec(ctx, "UPDATE "+table+" SET lease_expires_at = $1::timestamptz + interval '1 hour'"+
						" WHERE lease_expires_at IS NOT NULL", now)
					require.NoError(t, err)
					if seed%4 == 3 {
						_, err = conn.Exec(ctx, "UPDATE "+table+" SET lease_expires_at = $1::timestamptz - interval '1 minute'"+
							" WHERE message_id = (SELECT message_id FROM "+table+" WHERE lease_expires_at IS NOT NULL"+
							" ORDER BY message_id LIMIT 1)", now)
						require.NoError(t, err)
					}
					_, err = conn.Exec(ctx, "ANALYZE "+table)
					require.NoError(t, err)
				}

				// Odd seeds: another session holds row locks on a random
				// tenth of the rows; both claims must skip them.
				var lockTx pgx.Tx
				if seed%2 == 1 {
					var locked []uuid.UUID
					for _, id := range ids {
						if rng.IntN(10) == 0 {
							locked = append(locked, id)
						}
					}
					lockTx, err = locker.Begin(ctx)
					require.NoError(t, err)
					_, err = lockTx.Exec(ctx, "SELECT 1 FROM "+pgx.Identifier{q.table}.Sanitize()+
						" WHERE message_id = ANY($1::uuid[]) FOR UPDATE", locked)
					require.NoError(t, err)
				}

				for _, mode := range modes {
					for _, n := range batches {
						for _, tenant := range tenants {
							want := inRolledBackTx(t, conn.Conn(), mode, func(tx pgx.Tx) []uuid.UUID {
								rows, err := tx.Query(ctx, seedSQL, now, tenant, n)
								require.NoError(t, err)
								got, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
								require.NoError(t, err)
								return got
							})
							got := inRolledBackTx(t, conn.Conn(), mode, func(tx pgx.Tx) []uuid.UUID {
								got, err := q.claim(ctx, tx, &now, tenant, n)
								require.NoError(t, err)
								return got
							})
							require.Equal(t, want, got, "seed %d, batch %d, tenant %v, mode %q", seed, n, deref(tenant), mode)
						}
					}
				}
				if lockTx != nil {
					require.NoError(t, lockTx.Rollback(ctx))
				}
			}
		})
	}
}

// loadRandomRows replaces the table's rows with 300 random ones around now
// and ANALYZEs it: every status, due and deferred rows, expired and live
// leases, boundary times equal to now, three tenants (one NULL), and
// created_at drawn from 40 values so that ties are common. It returns the ids.
func loadRandomRows(t *testing.T, conn *pgx.Conn, q equivQueue, rng *rand.Rand, now time.Time) []uuid.UUID {
	t.Helper()
	ctx := t.Context()
	_, err := conn.Exec(ctx, "TRUNCATE "+pgx.Identifier{q.table}.Sanitize())
	require.NoError(t, err)

	offset := func() time.Time { // before, at or after now
		switch rng.IntN(5) {
		case 0:
			return now
		case 1, 2:
			return now.Add(-time.Duration(1+rng.IntN(600)) * time.Second)
		}
		return now.Add(time.Duration(1+rng.IntN(600)) * time.Second)
	}
	const n = 300
	ids := make([]uuid.UUID, n)
	rows := make([][]any, n)
	for i := range rows {
		var id uuid.UUID
		for j := range id {
			id[j] = byte(rng.UintN(256))
		}
		ids[i] = id
		created := now.Add(-time.Hour + time.Duration(rng.IntN(40))*time.Second)
		var tenant *string
		switch rng.IntN(3) {
		case 1:
			tenant = ptr("a")
		case 2:
			tenant = ptr("b")
		}
		status, visible := "pending", offset()
		var owner *string
		var expires, done, dead *time.Time
		gen, attempts := int64(0), int32(0)
		switch r := rng.IntN(20); {
		case r < 6:
		case r < 9:
			status, gen, attempts = "failed", 1, 1
		case r < 14:
			status, owner, gen, attempts = q.inFlight, ptr("w"), 1, 1
			e := offset()
			expires = &e
		case r < 18:
			status, owner, gen, attempts = q.success, ptr("w"), 1, 1
			d := created.Add(time.Second)
			done = &d
		default:
			status, gen, attempts = "dead_lettered", 3, 3
			d := created.Add(time.Second)
			dead = &d
		}
		rows[i] = []any{id, []byte{1}, tenant, created, visible, status, owner, expires, gen, attempts, done, dead}
	}
	cols := []string{"message_id", "payload", "tenant_id", "created_at", "visible_after", "status",
		"lease_owner", "lease_expires_at", "lease_generation", "attempt_count", q.doneAt, "dead_lettered_at"}
	_, err = conn.CopyFrom(ctx, pgx.Identifier{q.table}, cols, pgx.CopyFromRows(rows))
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "ANALYZE "+pgx.Identifier{q.table}.Sanitize())
	require.NoError(t, err)
	return ids
}

// inRolledBackTx runs fn in a transaction with the planner settings of
// mode and rolls it back.
func inRolledBackTx(t *testing.T, conn *pgx.Conn, mode string, fn func(pgx.Tx) []uuid.UUID) []uuid.UUID {
	t.Helper()
	ctx := t.Context()
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	defer func() { require.NoError(t, tx.Rollback(ctx)) }()
	if mode != "" {
		_, err := tx.Exec(ctx, mode)
		require.NoError(t, err)
	}
	return fn(tx)
}

func ptr[T any](v T) *T { return &v }

func deref(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return *s
}
