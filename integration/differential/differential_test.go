package differential_test

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/internal/dbtest"
	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/leasingtest"
)

// Differential testing: one random sequence of store calls runs against
// leasing.Memory and leasing.Postgres (both on one manual clock, both given
// the same message ids), and every observable result must agree: errors by
// kind (argument errors by text), returned leases in order with generation,
// attempt and expiry, per-message outcomes, renew results, requeue and purge
// counts, stats, and at the end every row of both queues.
//
// TestDifferential runs fixed seeds (20 × 60 operations; 200 × 300 under
// -stress). FuzzDifferential lets `go test -fuzz` drive the same operations
// from bytes; its corpus in testdata/fuzz/FuzzDifferential holds the seeds
// and every failing input found, as regression cases.

func TestDifferential(t *testing.T) {
	t.Parallel()
	seeds, ops := pick(20, 200), pick(60, 300)
	dbs := &dbtest.RecycledDBs{Owner: t}
	for seed := range seeds {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			t.Parallel()
			pool := newPool(t, dbs.Get(t), "leasestore-differential", 2)
			r := newDiffRun(t, pool, randChooser{rand.New(rand.NewPCG(uint64(seed), 0x5eed))}, uint64(seed))
			r.run(ops)
		})
	}
}

func FuzzDifferential(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte("\x00\x01\x00\x02\x01\x00\x03\x05\x07\x01\x02"))
	pool := newPool(f, freshURL(f), "leasestore-differential", 2)
	f.Fuzz(func(t *testing.T, data []byte) {
		_, err := pool.Exec(context.Background(), truncateQueues)
		require.NoError(t, err)
		r := newDiffRun(t, pool, &byteChooser{data: data}, 0)
		r.run(400)
	})
}

// chooser makes the run's decisions: from a seeded PRNG or from fuzz bytes.
type chooser interface {
	// intn returns a number in [0, n), n >= 1.
	intn(n int) int
	// exhausted reports that a byte-driven run has used up its input.
	exhausted() bool
}

type randChooser struct{ r *rand.Rand }

func (c randChooser) intn(n int) int { return c.r.IntN(n) }
func (randChooser) exhausted() bool  { return false }

type byteChooser struct {
	data []byte
	pos  int
}

func (c *byteChooser) intn(n int) int {
	if n <= 1 || c.pos >= len(c.data) {
		return 0
	}
	b := int(c.data[c.pos])
	c.pos++
	return b % n
}

func (c *byteChooser) exhausted() bool { return c.pos >= len(c.data) }

// leasePair is one claim's lease as each store returned it.
type leasePair struct {
	q        leasing.Queue
	mem, pg  leasing.Lease
	gen      int64
	id       uuid.UUID
	ownerTag string
}

type diffRun struct {
	t     *testing.T
	ctx   context.Context
	c     chooser
	salt  uint64
	seq   uint64
	clock *leasingtest.Clock
	mem   map[leasing.Queue]*leasing.Memory
	pg    map[leasing.Queue]*leasing.Postgres
	known map[leasing.Queue][]uuid.UUID
	isKn  map[leasing.Queue]map[uuid.UUID]bool
	pairs []leasePair
	trace []string
	// seen counts what the run exercised, by result, for the log.
	seen map[string]int
}

func newDiffRun(t *testing.T, pool *pgxpool.Pool, c chooser, salt uint64) *diffRun {
	r := &diffRun{
		t: t, ctx: context.Background(), c: c, salt: salt,
		clock: leasingtest.NewClock(leasingtest.Start),
		mem:   map[leasing.Queue]*leasing.Memory{},
		pg:    map[leasing.Queue]*leasing.Postgres{},
		known: map[leasing.Queue][]uuid.UUID{},
		isKn:  map[leasing.Queue]map[uuid.UUID]bool{},
		seen:  map[string]int{},
	}
	for _, q := range queuesBoth {
		m, err := leasing.NewMemory(q, leasing.MemoryOptions{Now: r.clock.Now})
		require.NoError(t, err)
		p, err := leasing.NewPostgres(pool, q, leasing.PostgresOptions{Now: r.clock.Now})
		require.NoError(t, err)
		r.mem[q], r.pg[q], r.isKn[q] = m, p, map[uuid.UUID]bool{}
	}
	return r
}

// diffOps are the operations and their weights.
var diffOps = []struct {
	name   string
	weight int
	run    func(r *diffRun, q leasing.Queue)
}{
	{"enqueue", 20, (*diffRun).enqueue},
	{"claim", 20, (*diffRun).claim},
	{"renew", 8, (*diffRun).renew},
	{"release", 5, (*diffRun).release},
	{"complete", 10, (*diffRun).complete},
	{"fail", 8, (*diffRun).fail},
	{"dead-letter", 5, (*diffRun).deadLetter},
	{"requeue", 5, (*diffRun).requeue},
	{"purge", 2, (*diffRun).purge},
	{"advance", 12, (*diffRun).advance},
	{"stats", 2, (*diffRun).stats},
	{"get", 3, (*diffRun).get},
	{"dead-letter-by-id", 3, (*diffRun).deadLetterByID},
	{"strict-ordering", 1, (*diffRun).strictOrdering},
}

func (r *diffRun) run(ops int) {
	total := 0
	for _, op := range diffOps {
		total += op.weight
	}
	for i := 0; i < ops && !r.c.exhausted(); i++ {
		q := queuesBoth[r.c.intn(2)]
		n := r.c.intn(total)
		for _, op := range diffOps {
			if n < op.weight {
				op.run(r, q)
				break
			}
			n -= op.weight
		}
	}
	r.compareAll()
	r.t.Logf("exercised: %v", r.seen)
}

// oneOf returns one of vs, chosen by the run.
func oneOf[T any](r *diffRun, vs ...T) T { return vs[r.c.intn(len(vs))] }

// newID returns the next message id: deterministic from the run's salt, in
// no particular order, so that ties on created_at are broken by id.
func (r *diffRun) newID() uuid.UUID {
	r.seq++
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], r.salt)
	binary.BigEndian.PutUint64(b[8:], r.seq)
	sum := sha256.Sum256(b[:])
	id, _ := uuid.FromBytes(sum[:16])
	return id
}

func (r *diffRun) log(format string, args ...any) {
	r.trace = append(r.trace, fmt.Sprintf("%3d %s: ", len(r.trace), r.clock.Now().Sub(leasingtest.Start))+fmt.Sprintf(format, args...))
}

// same fails the test when mem and pg differ, with the trace so far.
func (r *diffRun) same(what string, mem, pg any) {
	r.t.Helper()
	if fmt.Sprint(mem) == fmt.Sprint(pg) {
		return
	}
	r.t.Fatalf("differential mismatch in %s\nmemory:   %v\npostgres: %v\ntrace (clock offset from leasingtest.Start):\n%s",
		what, mem, pg, strings.Join(r.trace, "\n"))
}

func (r *diffRun) remember(q leasing.Queue, ids ...uuid.UUID) {
	for _, id := range ids {
		if !r.isKn[q][id] {
			r.isKn[q][id] = true
			r.known[q] = append(r.known[q], id)
		}
	}
}

var (
	diffOwners    = []string{"w1", "w2", "w3"}
	diffTenants   = []string{"", "", "a", "b"}
	diffDelays    = []time.Duration{0, 0, 0, time.Microsecond, time.Millisecond, time.Second, 30 * time.Second}
	diffLeaseFors = []time.Duration{time.Millisecond, time.Second, 30 * time.Second, 30 * time.Second}
	// Few keys, so that lines form and heads are shared by tenants.
	diffOrderingKeys = []string{"", "", "", "x", "x", "y", "z"}
	diffErrors       = []string{"boom", "", "nul\x00byte", "bad \xff\xfe utf8", strings.Repeat("é", leasing.MaxErrorBytes)}
)

func (r *diffRun) enqueue(q leasing.Queue) {
	msgs := make([]leasing.NewMessage, 1+r.c.intn(3))
	for i := range msgs {
		m := leasing.NewMessage{ID: r.newID()}
		switch r.c.intn(16) {
		case 0, 1:
			if len(r.known[q]) > 0 {
				m.ID = r.known[q][r.c.intn(len(r.known[q]))] // already present
			}
		case 2:
			if i > 0 {
				m.ID = msgs[i-1].ID // twice in one batch: an argument error
			}
		}
		m.Type = oneOf(r, "", "order.created")
		if r.c.intn(3) > 0 {
			m.Payload = []byte{byte(r.c.intn(256)), 0, byte(i)}
		}
		m.Headers = oneOf(r, nil, json.RawMessage(`{"b": 2, "a":"x"}`))
		m.TenantID = oneOf(r, diffTenants...)
		if q == leasing.Inbox {
			m.IdempotencyKey = oneOf(r, "", "", "", "k1", "k2")
		} else {
			m.Topic = oneOf(r, "", "orders")
		}
		m.OrderingKey = oneOf(r, diffOrderingKeys...)
		m.Delay = oneOf(r, diffDelays...)
		if r.c.intn(25) == 0 {
			m.Delay = -time.Second
		}
		msgs[i] = m
	}
	var desc []string
	for _, m := range msgs {
		desc = append(desc, fmt.Sprintf("{%s tenant=%q key=%q topic=%q ordering=%q delay=%s}", short(m.ID), m.TenantID, m.IdempotencyKey, m.Topic, m.OrderingKey, m.Delay))
	}
	r.log("%s enqueue %s", q, strings.Join(desc, " "))
	mres, merr := r.mem[q].Enqueue(r.ctx, msgs...)
	pres, perr := r.pg[q].Enqueue(r.ctx, msgs...)
	r.same("enqueue error", errKind(merr), errKind(perr))
	r.same("enqueue ids", mres.IDs, pres.IDs)
	r.same("enqueue duplicates", mres.Duplicates, pres.Duplicates)
	r.seen["enqueue duplicates"] += len(mres.Duplicates)
	r.seen["enqueue "+strings.SplitN(errKind(merr), ":", 2)[0]]++
	if merr == nil {
		dup := map[uuid.UUID]bool{}
		for _, id := range mres.Duplicates {
			dup[id] = true
		}
		for _, id := range mres.IDs {
			if !dup[id] {
				r.remember(q, id)
			}
		}
	}
}

func (r *diffRun) claim(q leasing.Queue) {
	req := leasing.ClaimRequest{
		Owner:     oneOf(r, diffOwners...),
		BatchSize: oneOf(r, 1, 2, 3, 5, 10),
		LeaseFor:  oneOf(r, diffLeaseFors...),
		TenantID:  oneOf(r, "", "", "a", "b", "c"),
	}
	if r.c.intn(30) == 0 {
		req.BatchSize = 0
	}
	r.log("%s claim owner=%s batch=%d lease=%s tenant=%q", q, req.Owner, req.BatchSize, req.LeaseFor, req.TenantID)
	ml, merr := r.mem[q].Claim(r.ctx, req)
	pl, perr := r.pg[q].Claim(r.ctx, req)
	r.same("claim error", errKind(merr), errKind(perr))
	r.same("claim leases", normLeases(ml), normLeases(pl))
	r.seen["claimed"] += len(ml)
	for _, l := range ml {
		if l.Generation > 1 {
			r.seen["reclaimed"]++
		}
	}
	for i := range ml {
		r.pairs = append(r.pairs, leasePair{q: q, mem: ml[i], pg: pl[i], gen: ml[i].Generation, id: ml[i].Message.ID, ownerTag: ml[i].Owner})
	}
	r.log("  -> %d leases", len(ml))
}

// leases picks a batch of one owner's leases of queue q, mostly the latest
// lease of each message, sometimes stale ones, a lease for an unknown id,
// a duplicate or a lease of the other queue. ok is false when q has no leases.
func (r *diffRun) leases(q leasing.Queue) (mem, pg []leasing.Lease, ok bool) {
	var cands []int
	latest := map[uuid.UUID]int64{}
	for i, p := range r.pairs {
		if p.q == q {
			cands = append(cands, i)
			latest[p.id] = max(latest[p.id], p.gen)
		}
	}
	if len(cands) == 0 {
		return nil, nil, false
	}
	first := r.pairs[cands[r.c.intn(len(cands))]]
	chosen := []leasePair{first}
	seen := map[uuid.UUID]bool{first.id: true}
	allowDup := r.c.intn(25) == 0
	for _, i := range cands {
		p := r.pairs[i]
		if p.ownerTag != first.ownerTag || (seen[p.id] && !allowDup) || (p.id == first.id && p.gen == first.gen) {
			continue
		}
		odds := 4
		if p.gen == latest[p.id] {
			odds = 2
		}
		if r.c.intn(odds) == 0 {
			chosen = append(chosen, p)
			seen[p.id] = true
		}
	}
	for _, p := range chosen {
		mem, pg = append(mem, p.mem), append(pg, p.pg)
	}
	switch r.c.intn(20) {
	case 0: // a message no store holds
		ghostM, ghostP := first.mem, first.pg
		ghostM.Message.ID = r.newID()
		ghostP.Message.ID = ghostM.Message.ID
		mem, pg = append(mem, ghostM), append(pg, ghostP)
	case 1: // a lease from the other queue
		for _, p := range r.pairs {
			if p.q != q && p.ownerTag == first.ownerTag {
				mem, pg = append(mem, p.mem), append(pg, p.pg)
				break
			}
		}
	}
	return mem, pg, true
}

func describe(ls []leasing.Lease) string {
	var parts []string
	for _, l := range ls {
		parts = append(parts, fmt.Sprintf("%s/%s@%s#%d", l.Queue, short(l.Message.ID), l.Owner, l.Generation))
	}
	return strings.Join(parts, " ")
}

func (r *diffRun) renew(q leasing.Queue) {
	ml, pl, ok := r.leases(q)
	if !ok {
		return
	}
	d := oneOf(r, diffLeaseFors...)
	r.log("%s renew %s for %s", q, describe(ml), d)
	mres, merr := r.mem[q].Renew(r.ctx, d, ml...)
	pres, perr := r.pg[q].Renew(r.ctx, d, pl...)
	r.same("renew error", errKind(merr), errKind(perr))
	r.same("renew renewed", normLeases(mres.Renewed), normLeases(pres.Renewed))
	r.same("renew lost", mres.Lost, pres.Lost)
	r.seen["renewed"] += len(mres.Renewed)
	r.seen["renew lost"] += len(mres.Lost)
}

func (r *diffRun) write(q leasing.Queue, name string, do func(leasing.Store, []leasing.Lease) (leasing.WriteResult, error)) {
	ml, pl, ok := r.leases(q)
	if !ok {
		return
	}
	r.log("%s %s %s", q, name, describe(ml))
	mres, merr := do(r.mem[q], ml)
	pres, perr := do(r.pg[q], pl)
	r.same(name+" error", errKind(merr), errKind(perr))
	r.same(name+" outcomes", mres.Outcomes, pres.Outcomes)
	var outs []string
	for _, o := range mres.Outcomes {
		outs = append(outs, string(o.Outcome))
		r.seen[name+" "+string(o.Outcome)]++
	}
	if merr != nil {
		r.seen[name+" error"]++
	}
	r.log("  -> %s", strings.Join(outs, ","))
}

func (r *diffRun) release(q leasing.Queue) {
	r.write(q, "release", func(s leasing.Store, ls []leasing.Lease) (leasing.WriteResult, error) {
		return s.Release(r.ctx, ls...)
	})
}

func (r *diffRun) complete(q leasing.Queue) {
	r.write(q, "complete", func(s leasing.Store, ls []leasing.Lease) (leasing.WriteResult, error) {
		return s.Complete(r.ctx, ls...)
	})
}

// failures turns leases into failures; the choices are made once per call
// of the returned function's first use so that both stores get the same.
func (r *diffRun) failures(name string, retry bool) func(leasing.Store, []leasing.Lease) (leasing.WriteResult, error) {
	var delays []time.Duration
	var texts []string
	return func(s leasing.Store, ls []leasing.Lease) (leasing.WriteResult, error) {
		if delays == nil {
			for range ls {
				d := oneOf(r, 0, time.Millisecond, time.Second, time.Minute)
				if retry && r.c.intn(30) == 0 {
					d = -time.Millisecond
				}
				delays = append(delays, d)
				texts = append(texts, oneOf(r, diffErrors...))
			}
			var parts []string
			for i := range delays {
				parts = append(parts, fmt.Sprintf("(%s %.12q)", delays[i], texts[i]))
			}
			r.log("  failures %s", strings.Join(parts, " "))
		}
		fs := make([]leasing.Failure, len(ls))
		for i, l := range ls {
			fs[i] = leasing.Failure{Lease: l, RetryAfter: delays[i], Error: texts[i]}
		}
		if name == "fail" {
			return s.Fail(r.ctx, fs...)
		}
		return s.DeadLetter(r.ctx, fs...)
	}
}

func (r *diffRun) fail(q leasing.Queue) { r.write(q, "fail", r.failures("fail", true)) }
func (r *diffRun) deadLetter(q leasing.Queue) {
	r.write(q, "dead-letter", r.failures("dead-letter", false))
}

func (r *diffRun) requeue(q leasing.Queue) {
	if r.c.intn(4) == 0 {
		r.log("%s requeue all", q)
		mres, merr := r.mem[q].RequeueAll(r.ctx)
		pres, perr := r.pg[q].RequeueAll(r.ctx)
		r.same("requeue-all error", errKind(merr), errKind(perr))
		r.same("requeue-all result", mres, pres)
		return
	}
	var ids []uuid.UUID
	for range 1 + r.c.intn(3) {
		if len(r.known[q]) == 0 || r.c.intn(6) == 0 {
			ids = append(ids, r.newID())
		} else {
			ids = append(ids, r.known[q][r.c.intn(len(r.known[q]))])
		}
	}
	if r.c.intn(30) != 0 {
		ids = slices.Compact(slices.SortedFunc(slices.Values(ids), func(a, b uuid.UUID) int { return strings.Compare(a.String(), b.String()) }))
	}
	var s []string
	for _, id := range ids {
		s = append(s, short(id))
	}
	r.log("%s requeue %s", q, strings.Join(s, " "))
	mres, merr := r.mem[q].Requeue(r.ctx, ids...)
	pres, perr := r.pg[q].Requeue(r.ctx, ids...)
	r.same("requeue error", errKind(merr), errKind(perr))
	r.same("requeue result", mres, pres)
	r.seen["requeued"] += len(mres.Requeued)
}

// deadLetterByID is the operator's dead-letter of a known id (sometimes an
// unknown one), forced or not: both stores must refuse or write alike,
// with the same history entry.
func (r *diffRun) deadLetterByID(q leasing.Queue) {
	req := leasing.DeadLetterByIDRequest{ID: r.newID(), Reason: oneOf(r, "poison", "by hand", " ", "nul\x00byte"), Force: r.c.intn(2) == 0}
	if len(r.known[q]) > 0 && r.c.intn(6) > 0 {
		req.ID = r.known[q][r.c.intn(len(r.known[q]))]
	}
	r.log("%s dead-letter-by-id %s force=%t reason=%q", q, short(req.ID), req.Force, req.Reason)
	ma, merr := r.mem[q].DeadLetterByID(r.ctx, req)
	pa, perr := r.pg[q].DeadLetterByID(r.ctx, req)
	r.same("dead-letter-by-id error", errKind(merr), errKind(perr))
	r.same("dead-letter-by-id entry", normAttempts([]leasing.Attempt{ma}), normAttempts([]leasing.Attempt{pa}))
	r.seen["dead-letter-by-id "+strings.SplitN(errKind(merr), ":", 2)[0]]++
}

func (r *diffRun) purge(q leasing.Queue) {
	// A batch that covers every eligible row: which rows a smaller batch
	// deletes is unspecified.
	req := leasing.PurgeRequest{OlderThan: oneOf(r, time.Microsecond, time.Second, time.Hour), BatchSize: leasing.MaxBatchSize, IncludeDeadLettered: r.c.intn(2) == 0}
	r.log("%s purge %+v", q, req)
	mn, merr := r.mem[q].Purge(r.ctx, req)
	pn, perr := r.pg[q].Purge(r.ctx, req)
	r.same("purge error", errKind(merr), errKind(perr))
	r.same("purge count", mn, pn)
	r.seen["purged"] += mn
}

func (r *diffRun) advance(leasing.Queue) {
	d := oneOf(r, time.Microsecond, time.Millisecond, 500*time.Millisecond, time.Second, 30*time.Second, 2*time.Minute)
	r.clock.Advance(d)
	r.log("advance %s", d)
}

func (r *diffRun) stats(q leasing.Queue) {
	r.log("%s stats", q)
	ms, merr := r.mem[q].Stats(r.ctx)
	ps, perr := r.pg[q].Stats(r.ctx)
	r.same("stats error", errKind(merr), errKind(perr))
	r.same("stats", normStats(ms), normStats(ps)) // fmt prints maps sorted by key
}

// normStats prints st with its waiting head's fields, not its address.
func normStats(st leasing.Stats) string {
	head := "nil"
	if h := st.WaitingHead; h != nil {
		head = fmt.Sprintf("{tenant=%q key=%q head=%s age=%s}", h.TenantID, h.OrderingKey, h.MessageID, h.Age)
	}
	st.WaitingHead = nil
	return fmt.Sprintf("%v head=%s", st, head)
}

// strictOrdering turns strict ordering on or off in both stores.
func (r *diffRun) strictOrdering(q leasing.Queue) {
	strict := r.c.intn(2) == 0
	r.log("%s strict ordering %t", q, strict)
	require.NoError(r.t, r.mem[q].SetStrictOrdering(r.ctx, strict))
	require.NoError(r.t, r.pg[q].SetStrictOrdering(r.ctx, strict))
	r.seen[fmt.Sprintf("strict %t", strict)]++
}

func (r *diffRun) get(q leasing.Queue) {
	id := r.newID()
	if len(r.known[q]) > 0 && r.c.intn(5) > 0 {
		id = r.known[q][r.c.intn(len(r.known[q]))]
	}
	r.log("%s get %s", q, short(id))
	mrow, merr := r.mem[q].Get(r.ctx, id)
	prow, perr := r.pg[q].Get(r.ctx, id)
	r.same("get error", errKind(merr), errKind(perr))
	if merr == nil && perr == nil {
		r.same("get row", normRow(mrow), normRow(prow))
	}
}

// compareAll compares every row of both queues, in (created_at, id) order.
func (r *diffRun) compareAll() {
	r.t.Helper()
	for _, q := range queuesBoth {
		var mrows, prows []string
		for _, row := range r.mem[q].Rows() {
			mrows = append(mrows, normRow(row))
		}
		var after time.Time
		afterID := uuid.Nil
		for {
			page, err := r.pg[q].List(r.ctx, after, afterID, 500)
			require.NoError(r.t, err)
			for _, row := range page {
				prows = append(prows, normRow(row))
			}
			if len(page) < 500 {
				break
			}
			after, afterID = page[len(page)-1].CreatedAt, page[len(page)-1].ID
		}
		r.same(string(q)+" final row count", len(mrows), len(prows))
		for i := range mrows {
			r.same(fmt.Sprintf("%s final row %d", q, i), mrows[i], prows[i])
		}
	}
}

func short(id uuid.UUID) string { return id.String()[:8] }

// errKind names an error for comparison: argument errors by their text,
// sentinels by name, anything else (a driver error) as "other".
func errKind(err error) string {
	var (
		ae       *leasing.ArgumentError
		conflict *leasing.OrderingKeyConflictError
	)
	switch {
	case err == nil:
		return "ok"
	case errors.As(err, &ae):
		return "invalid argument: " + ae.Error()
	case errors.Is(err, leasing.ErrDuplicate):
		return "duplicate"
	case errors.As(err, &conflict):
		return "ordering key conflict: " + conflict.ID.String()
	case errors.Is(err, leasing.ErrNotFound):
		return "not found"
	case errors.Is(err, leasing.ErrLeaseHeld):
		return "lease held: " + err.Error()
	case errors.Is(err, leasing.ErrAlreadyTerminal):
		return "already terminal: " + err.Error()
	}
	return "other: " + err.Error()
}

func normTime(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

func normTimePtr(t *time.Time) string {
	if t == nil {
		return "nil"
	}
	return normTime(*t)
}

// normJSON re-encodes a JSON document (jsonb reorders keys and spaces).
func normJSON(b json.RawMessage) string {
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		return "invalid:" + string(b)
	}
	out, _ := json.Marshal(v)
	return string(out)
}

func normMessage(m leasing.Message) string {
	return fmt.Sprintf("id=%s type=%q payload=%x headers=%s tenant=%q key=%q topic=%q ordering=%q created=%s visible=%s",
		m.ID, m.Type, m.Payload, normJSON(m.Headers), m.TenantID, m.IdempotencyKey, m.Topic, m.OrderingKey,
		normTime(m.CreatedAt), normTime(m.VisibleAfter))
}

func normLeases(ls []leasing.Lease) []string {
	out := make([]string, len(ls))
	for i, l := range ls {
		out[i] = fmt.Sprintf("{%s owner=%q gen=%d expires=%s attempt=%d last_error=%q %s}",
			l.Queue, l.Owner, l.Generation, normTime(l.ExpiresAt), l.Attempt, l.LastError, normMessage(l.Message))
	}
	return out
}

func normRow(r leasing.Row) string {
	return fmt.Sprintf("{%s status=%s seq=%d owner=%q expires=%s gen=%d attempts=%d attempted=%s last_error=%q finished=%s dead=%s history=%s}",
		normMessage(r.Message), r.Status, r.KeySeq, r.LeaseOwner, normTimePtr(r.LeaseExpiresAt), r.LeaseGeneration, r.AttemptCount,
		normTimePtr(r.LastAttemptedAt), r.LastError, normTimePtr(r.FinishedAt), normTimePtr(r.DeadLetteredAt), normAttempts(r.Attempts))
}

// normAttempts prints an attempt history, entry by entry, with UTC times.
func normAttempts(history []leasing.Attempt) string {
	parts := make([]string, len(history))
	for i, a := range history {
		parts[i] = fmt.Sprintf("{#%d gen=%d owner=%q claimed=%s finished=%s %s error=%q operator=%t forced=%t}",
			a.Attempt, a.Generation, a.Owner, normTimePtr(a.ClaimedAt), normTime(a.FinishedAt), a.Outcome, a.Error, a.Operator, a.Forced)
	}
	return "[" + strings.Join(parts, " ") + "]"
}
