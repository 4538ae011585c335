package processor_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/processor"
)

// parkCase is one value, written by hand into a due row, that today's
// claim cannot lease: set is the SET clause ($2 is the queue's in-flight
// status), reason the last_error the claim parks the row with.
type parkCase struct {
	name, set, reason string
}

var parkCases = []parkCase{
	{"AttemptCountAtLimit", `attempt_count = 2147483647`,
		"parked by the claim: attempt_count is at its limit (2147483647)"},
	{"LeaseGenerationAtLimit", `lease_generation = 9223372036854775807`,
		"parked by the claim: lease_generation is at its limit (9223372036854775807)"},
	{"ExpiredLeaseAtGenerationLimit", `status = $2, lease_owner = 'gone', lease_expires_at = timestamptz '2000-01-01 00:00:00Z',
		lease_generation = 9223372036854775807`,
		"parked by the claim: lease_generation is at its limit (9223372036854775807)"},
	{"HeadersArray", `headers = '[1]'`, "parked by the claim: headers are a JSON array, not an object"},
	{"HeadersNull", `headers = 'null'`, "parked by the claim: headers are a JSON null, not an object"},
	{"CreatedAtMinusInfinity", `created_at = '-infinity'`,
		"parked by the claim: created_at is not a finite time: -infinity"},
	{"VisibleAfterMinusInfinity", `visible_after = '-infinity'`,
		"parked by the claim: visible_after is not a finite time: -infinity"},
}

// writeBadRow applies c to the row id of q's table, as an operator's or an
// older version's UPDATE would.
func writeBadRow(t *testing.T, conn *pgx.Conn, q leasing.Queue, id uuid.UUID, set string) {
	t.Helper()
	_, err := conn.Exec(context.Background(),
		fmt.Sprintf("UPDATE %s SET %s WHERE message_id = $1 AND $2::text IS NOT NULL", tableOf(q), set), id, string(q.InFlight()))
	require.NoError(t, err)
}

// parkedState is what the claim left in a parked row, read with SQL: Get
// cannot read a row whose times are infinite.
type parkedState struct {
	status, lastError       string
	deadLettered, leaseLeft bool
}

func readParked(t *testing.T, conn *pgx.Conn, q leasing.Queue, id uuid.UUID) parkedState {
	t.Helper()
	var s parkedState
	err := conn.QueryRow(context.Background(), fmt.Sprintf(`SELECT status, coalesce(last_error, ''),
		dead_lettered_at IS NOT NULL, lease_expires_at IS NOT NULL FROM %s WHERE message_id = $1`, tableOf(q)), id).
		Scan(&s.status, &s.lastError, &s.deadLettered, &s.leaseLeft)
	require.NoError(t, err)
	return s
}

func leaseIDs(leases []leasing.Lease) []uuid.UUID {
	out := make([]uuid.UUID, len(leases))
	for i, l := range leases {
		out[i] = l.Message.ID
	}
	return out
}

// TestClaimParksUnclaimableRows: a due row that holds a value no claim can
// lease (a counter at its type's limit, which the claim's + 1 would
// overflow; a time of -infinity, which no Go time holds; headers that are
// not a JSON object) at the head of the queue does not fail the claim: the
// claim leases the other rows, parks the bad one (dead-lettered, with the
// reason in last_error, in the same statement), reports it as a
// *leasing.ParkedError, and the next claim goes on behind it. On main the
// counters fail every claim with "integer/bigint out of range" and the
// infinite times fail after the claim committed, orphaning its leases.
func TestClaimParksUnclaimableRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, q := range queuesBoth {
		t.Run(string(q), func(t *testing.T) {
			t.Parallel()
			url := freshURL(t)
			store := openStore(t, url, q, leasing.PostgresOptions{})
			conn := adminConn(t, url)
			for _, c := range parkCases {
				t.Run(c.name, func(t *testing.T) {
					_, err := conn.Exec(ctx, "TRUNCATE "+tableOf(q))
					require.NoError(t, err)
					msgs := make([]leasing.NewMessage, 4)
					for i := range msgs {
						msgs[i] = leasing.NewMessage{Payload: []byte{byte(i)}}
					}
					msgs[2].Headers = []byte(`{"a":1}`) // an object, not of strings: claimable
					res, err := store.Enqueue(ctx, msgs...)
					require.NoError(t, err)
					bad, good := res.IDs[0], res.IDs[1:]
					writeBadRow(t, conn, q, bad, c.set)

					req := leasing.ClaimRequest{Owner: "w", BatchSize: 2, LeaseFor: time.Minute}
					leases, err := store.Claim(ctx, req)
					var pe *leasing.ParkedError
					require.ErrorAs(t, err, &pe)
					require.ErrorIs(t, err, leasing.ErrParked)
					require.Equal(t, q, pe.Queue)
					require.Equal(t, []leasing.ParkedRow{{ID: bad, Reason: c.reason}}, pe.Parked)
					require.Equal(t, good[:1], leaseIDs(leases), "the other picked row is leased")
					require.Equal(t, parkedState{status: "dead_lettered", lastError: c.reason, deadLettered: true}, readParked(t, conn, q, bad))

					leases, err = store.Claim(ctx, leasing.ClaimRequest{Owner: "w", BatchSize: 10, LeaseFor: time.Minute})
					require.NoError(t, err, "the next claim is not blocked by the parked row")
					require.Equal(t, good[1:], leaseIDs(leases))
					require.JSONEq(t, `{"a":1}`, string(leases[0].Message.Headers))
					wr, err := store.Complete(ctx, leases...)
					require.NoError(t, err)
					require.NoError(t, wr.Err(), "the leases beside a parked row are good")
				})
			}
		})
	}
}

// TestClaimParksAmongGoodRows: every kind of bad row at once, interleaved
// with good rows, through the tenant claim and CompleteAndClaim: one claim
// of the whole queue returns every good row in FIFO order and parks every
// bad one.
func TestClaimParksAmongGoodRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, q := range queuesBoth {
		t.Run(string(q), func(t *testing.T) {
			t.Parallel()
			url := freshURL(t)
			store := openStore(t, url, q, leasing.PostgresOptions{})
			conn := adminConn(t, url)
			msgs := make([]leasing.NewMessage, 2*len(parkCases)+1)
			for i := range msgs {
				msgs[i] = leasing.NewMessage{TenantID: "t1", Payload: []byte{byte(i)}}
			}
			res, err := store.Enqueue(ctx, msgs...)
			require.NoError(t, err)
			var good []uuid.UUID
			want := map[uuid.UUID]string{}
			for i, id := range res.IDs {
				if i%2 == 0 {
					good = append(good, id)
					continue
				}
				c := parkCases[i/2]
				writeBadRow(t, conn, q, id, c.set)
				want[id] = c.reason
			}

			// A first batch of one: done for CompleteAndClaim.
			first, err := store.Claim(ctx, leasing.ClaimRequest{Owner: "w", BatchSize: 1, LeaseFor: time.Minute, TenantID: "t1"})
			var pe *leasing.ParkedError
			if err != nil { // the head may be a -infinity row
				require.ErrorAs(t, err, &pe)
				for _, p := range pe.Parked {
					require.Equal(t, want[p.ID], p.Reason)
					delete(want, p.ID)
				}
			}
			if len(first) == 0 {
				first, err = store.Claim(ctx, leasing.ClaimRequest{Owner: "w", BatchSize: 1, LeaseFor: time.Minute, TenantID: "t1"})
				require.NoError(t, err)
			}
			require.Equal(t, good[:1], leaseIDs(first))

			wr, leases, err := store.CompleteAndClaim(ctx, first, leasing.ClaimRequest{Owner: "w", BatchSize: 100, LeaseFor: time.Minute, TenantID: "t1"})
			require.NoError(t, wr.Err())
			require.ErrorAs(t, err, &pe)
			got := map[uuid.UUID]string{}
			for _, p := range pe.Parked {
				got[p.ID] = p.Reason
			}
			require.Equal(t, want, got)
			require.True(t, slices.IsSortedFunc(pe.Parked, func(a, b leasing.ParkedRow) int { return slices.Compare(a.ID[:], b.ID[:]) }))
			require.Equal(t, good[1:], leaseIDs(leases), "every good row, FIFO")

			leases, err = store.Claim(ctx, leasing.ClaimRequest{Owner: "w", BatchSize: 100, LeaseFor: time.Minute})
			require.NoError(t, err)
			require.Empty(t, leases)
			var dead int
			require.NoError(t, conn.QueryRow(ctx, "SELECT count(*) FROM "+tableOf(q)+" WHERE status = 'dead_lettered'").Scan(&dead))
			require.Equal(t, len(parkCases), dead)
		})
	}
}

// TestProcessorParksBadRows: a processor on PostgreSQL whose queue holds
// bad rows among good ones handles every good row, never hands a bad one
// to its handler, reports each parking claim to OnError as a
// *leasing.ParkedError and counts litebus.<queue>.processor.parked.
func TestProcessorParksBadRows(t *testing.T) {
	t.Parallel()
	for _, q := range queuesBoth {
		t.Run(string(q), func(t *testing.T) {
			t.Parallel()
			b := e2eSetup(t, q)
			conn := adminConn(t, b.url)
			ids := b.enqueueN(t, 8)
			bad := map[uuid.UUID]string{
				ids[0]: parkCases[0].reason, // attempt_count at its limit
				ids[3]: parkCases[1].reason, // lease_generation at its limit
				ids[5]: parkCases[3].reason, // headers '[1]'
			}
			writeBadRow(t, conn, q, ids[0], parkCases[0].set)
			writeBadRow(t, conn, q, ids[3], parkCases[1].set)
			writeBadRow(t, conn, q, ids[5], parkCases[3].set)

			var (
				mu     sync.Mutex
				parked = map[uuid.UUID]string{}
				other  []error
			)
			pr := b.start(t, "p", e2eOK, processor.Options{BatchSize: 3, OnError: func(err error) {
				mu.Lock()
				defer mu.Unlock()
				var pe *leasing.ParkedError
				if !errors.As(err, &pe) {
					other = append(other, err)
					return
				}
				for _, p := range pe.Parked {
					parked[p.ID] = p.Reason
				}
			}})
			for _, id := range ids {
				if _, ok := bad[id]; ok {
					b.waitStatus(t, id, leasing.StatusDeadLettered)
				} else {
					b.waitStatus(t, id, q.Succeeded())
				}
			}
			pr.waitCounters(t, map[string]int64{"leases_acquired": 5, "succeeded": 5, "parked": 3})
			mu.Lock()
			defer mu.Unlock()
			require.Equal(t, bad, parked)
			require.Empty(t, other)
			for id, reason := range bad {
				require.Empty(t, b.broker.of(id), "a parked row is never delivered")
				require.Equal(t, reason, b.row(t, id).LastError)
			}
		})
	}
}

// TestDeadLetterByIDAtGenerationLimit: an operator's dead-letter of a
// message leased at lease_generation's limit (claimed at the limit minus
// one, which the claim still takes) dead-letters it instead of failing
// with bigint out of range; the generation stays and the holder's write
// reports terminal.
func TestDeadLetterByIDAtGenerationLimit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := freshURL(t)
	pool := newPool(t, url, "leasestore-dead-letter-limit", 2)
	for _, q := range queuesBoth {
		store, err := leasing.NewPostgres(pool, q, leasing.PostgresOptions{})
		require.NoError(t, err)
		msg := leasing.NewMessage{}
		if q == leasing.Outbox {
			msg.Topic = "t"
		}
		res, err := store.Enqueue(ctx, msg)
		require.NoError(t, err)
		id := res.IDs[0]
		_, err = pool.Exec(ctx, "UPDATE "+tableOf(q)+" SET lease_generation = 9223372036854775806 WHERE message_id = $1", id)
		require.NoError(t, err)
		leases, err := store.Claim(ctx, leasing.ClaimRequest{Owner: "w", BatchSize: 1, LeaseFor: time.Hour})
		require.NoError(t, err)
		require.Len(t, leases, 1)
		require.Equal(t, int64(9223372036854775807), leases[0].Generation)

		_, err = store.DeadLetterByID(ctx, leasing.DeadLetterByIDRequest{ID: id, Reason: "poison", Force: true})
		require.NoError(t, err, q)
		row, err := store.Get(ctx, id)
		require.NoError(t, err)
		require.Equal(t, leasing.StatusDeadLettered, row.Status)
		require.Equal(t, int64(9223372036854775807), row.LeaseGeneration)
		w, err := store.Complete(ctx, leases[0])
		require.NoError(t, err)
		require.Equal(t, leasing.OutcomeTerminal, w.Outcomes[0].Outcome, q)
	}
}

// TestClaimParkedHeadFreesItsKey: a keyed head that the claim parks frees
// its key in the transaction that follows the claim's, so the next message
// of the key is claimed next; when that transaction fails (here: a role
// that may claim but not lock the key rows), the *ParkedError says so in
// KeysNotFreed, the key stays held, and requeueing the fixed head lets the
// key go on.
func TestClaimParkedHeadFreesItsKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, q := range queuesBoth {
		t.Run(string(q), func(t *testing.T) {
			t.Parallel()
			url := freshURL(t)
			store := openStore(t, url, q, leasing.PostgresOptions{})
			conn := adminConn(t, url)
			claim := leasing.ClaimRequest{Owner: "w", BatchSize: 10, LeaseFor: time.Minute}
			enqueue := func() (head, next uuid.UUID) {
				res, err := store.Enqueue(ctx, leasing.NewMessage{OrderingKey: "k"}, leasing.NewMessage{OrderingKey: "k"})
				require.NoError(t, err)
				writeBadRow(t, conn, q, res.IDs[0], `headers = '[1]'`)
				return res.IDs[0], res.IDs[1]
			}

			head, next := enqueue()
			leases, err := store.Claim(ctx, claim)
			var pe *leasing.ParkedError
			require.ErrorAs(t, err, &pe)
			require.Equal(t, head, pe.Parked[0].ID)
			require.NoError(t, pe.KeysNotFreed)
			require.Empty(t, leases, "the next message of the key waits until the parked head's key is freed")
			leases, err = store.Claim(ctx, claim)
			require.NoError(t, err)
			require.Equal(t, []uuid.UUID{next}, leaseIDs(leases))
			_, err = store.Complete(ctx, leases...)
			require.NoError(t, err)

			// A role that may claim from the queue's table but not lock its
			// key rows: the claim parks the head, and freeing the key fails.
			role := grantedRole(t, url, "SELECT, UPDATE ON "+tableOf(q))
			limited := openStore(t, asUser(t, url, role), q, leasing.PostgresOptions{SkipSchemaCheck: true})

			head, next = enqueue()
			leases, err = limited.Claim(ctx, claim)
			require.ErrorAs(t, err, &pe)
			require.Empty(t, leases)
			require.Equal(t, head, pe.Parked[0].ID)
			require.ErrorContains(t, pe.KeysNotFreed, "permission denied")
			require.ErrorContains(t, err, "ordering keys stay held until they are requeued or purged")
			leases, err = store.Claim(ctx, claim)
			require.NoError(t, err)
			require.Empty(t, leases, "the key stays held by its parked head")

			_, err = conn.Exec(ctx, "UPDATE "+tableOf(q)+" SET headers = '{}' WHERE message_id = $1", head)
			require.NoError(t, err)
			rq, err := store.Requeue(ctx, head)
			require.NoError(t, err)
			require.Equal(t, []uuid.UUID{head}, rq.Requeued)
			leases, err = store.Claim(ctx, claim)
			require.NoError(t, err)
			require.Equal(t, []uuid.UUID{head}, leaseIDs(leases), "the requeued head holds its key again, first")
			_, err = store.Complete(ctx, leases...)
			require.NoError(t, err)
			leases, err = store.Claim(ctx, claim)
			require.NoError(t, err)
			require.Equal(t, []uuid.UUID{next}, leaseIDs(leases))
		})
	}
}
