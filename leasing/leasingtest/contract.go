package leasingtest

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/leasestore/leasestore/leasing"
	"github.com/stretchr/testify/require"
)

// Env is one isolated data set for one contract case.
type Env struct {
	// Clock drives every store Open returns: the stores decide visibility
	// and expiry by it alone.
	Clock *Clock
	// Open returns a store for queue q over the Env's data. Each call may
	// use its own connections; all stores of one Env see the same rows.
	Open func(t testing.TB, q leasing.Queue) leasing.Store
}

// Start is the clock reading contract cases begin at.
var Start = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

const lease = 30 * time.Second

// Run runs the whole contract, for both queues, against a fresh Env from
// newEnv for every case.
func Run(t *testing.T, newEnv func(t *testing.T) Env) {
	for _, q := range []leasing.Queue{leasing.Inbox, leasing.Outbox} {
		t.Run(string(q), func(t *testing.T) {
			for _, c := range cases {
				t.Run(c.name, func(t *testing.T) {
					t.Parallel()
					env := newEnv(t)
					c.run(t, &bundle{t: t, env: env, q: q, store: env.Open(t, q), ctx: context.Background()})
				})
			}
		})
	}
}

// bundle is what one case works with.
type bundle struct {
	t     *testing.T
	env   Env
	q     leasing.Queue
	store leasing.Store
	ctx   context.Context
}

func (b *bundle) enqueue(msgs ...leasing.NewMessage) []uuid.UUID {
	b.t.Helper()
	res, err := b.store.Enqueue(b.ctx, msgs...)
	require.NoError(b.t, err)
	require.Empty(b.t, res.Duplicates)
	return res.IDs
}

// enqueueN enqueues n messages one clock tick apart and returns their ids
// in FIFO order.
func (b *bundle) enqueueN(n int) []uuid.UUID {
	b.t.Helper()
	ids := make([]uuid.UUID, 0, n)
	for range n {
		ids = append(ids, b.enqueue(leasing.NewMessage{Payload: []byte("p")})...)
		b.env.Clock.Advance(time.Millisecond)
	}
	return ids
}

func (b *bundle) claim(owner string, n int) []leasing.Lease {
	b.t.Helper()
	leases, err := b.store.Claim(b.ctx, leasing.ClaimRequest{Owner: owner, BatchSize: n, LeaseFor: lease})
	require.NoError(b.t, err)
	require.NotNil(b.t, leases)
	return leases
}

// completeAndClaimer is the one-call complete and claim that Postgres and
// Memory offer beside Store; the cases that need it skip a store without it.
type completeAndClaimer interface {
	CompleteAndClaim(ctx context.Context, done []leasing.Lease, r leasing.ClaimRequest) (leasing.WriteResult, []leasing.Lease, error)
}

var (
	_ completeAndClaimer = (*leasing.Postgres)(nil)
	_ completeAndClaimer = (*leasing.Memory)(nil)
)

func (b *bundle) completeAndClaim(done []leasing.Lease, r leasing.ClaimRequest) (leasing.WriteResult, []leasing.Lease, error) {
	b.t.Helper()
	cc, ok := b.store.(completeAndClaimer)
	if !ok {
		b.t.Skip("the store has no CompleteAndClaim")
	}
	return cc.CompleteAndClaim(b.ctx, done, r)
}

func (b *bundle) get(id uuid.UUID) leasing.Row {
	b.t.Helper()
	row, err := b.store.Get(b.ctx, id)
	require.NoError(b.t, err)
	return row
}

func idsOf(leases []leasing.Lease) []uuid.UUID {
	ids := make([]uuid.UUID, len(leases))
	for i, l := range leases {
		ids[i] = l.Message.ID
	}
	return ids
}

func outcomes(res leasing.WriteResult) []leasing.Outcome {
	out := make([]leasing.Outcome, len(res.Outcomes))
	for i, o := range res.Outcomes {
		out[i] = o.Outcome
	}
	return out
}

// contractCase is one contract case: a name (Operation/Behaviour) and what
// it runs against a fresh bundle.
type contractCase struct {
	name string
	run  func(t *testing.T, b *bundle)
}

// cases are every contract case, grouped by operation: claims
// (contract_claim.go), renews (contract_renew.go), outcome writes
// (contract_write.go), enqueues (contract_enqueue.go), requeue, stats and
// purge (contract_queue.go), the attempt history and the operator's
// dead-letter (contract_history.go), ordering keys (contract_ordering.go),
// then bad input (contract_badinput.go)
// and concurrent claims.
var cases = slices.Concat(claimCases, topicCases, pauseCases, renewCases, writeCases, enqueueCases, queueCases, historyCases, orderingCases, []contractCase{
	{"BadInput/RejectedAndNothingChanged", badInput},
	{"Concurrency/DisjointClaims", disjointClaims},
})
