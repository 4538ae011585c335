package differential_test

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/leasestore/leasestore/leasing"
	"github.com/stretchr/testify/require"
)

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
		m.Type = oneOf(r, "", "order.created", "order.paid")
		if r.c.intn(3) > 0 {
			m.Payload = []byte{byte(r.c.intn(256)), 0, byte(i)}
		}
		m.Headers = oneOf(r, nil, json.RawMessage(`{"b": 2, "a":"x"}`))
		m.TenantID = oneOf(r, diffTenants...)
		if q == leasing.Inbox {
			m.IdempotencyKey = oneOf(r, "", "", "", "k1", "k2")
		} else {
			m.Topic = oneOf(r, "", "orders", "payments")
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
		dup := map[int]bool{}
		for _, d := range mres.Duplicates {
			dup[d.Index] = true
		}
		var added []uuid.UUID
		for i, id := range mres.IDs {
			if !dup[i] {
				r.remember(q, id)
				added = append(added, id)
			}
		}
		r.alignGenerations(q, added)
	}
}

// alignGenerations gives the rows ids just enqueued on PostgreSQL the
// first lease generation the Memory store gave them. The stores start a
// new row's generations from different sources (the enqueueing
// transaction's id; the highest generation of a purged row), which are
// alike only in starting above every purged row's, so the run compares
// what happens from there on.
func (r *diffRun) alignGenerations(q leasing.Queue, ids []uuid.UUID) {
	if len(ids) == 0 {
		return
	}
	first, err := r.mem[q].Get(r.ctx, ids[0])
	if err != nil {
		r.t.Fatalf("align generations: %v", err)
	}
	_, err = r.pg[q].Pool().Exec(r.ctx, "UPDATE "+q.Table()+" SET lease_generation = $1 WHERE message_id = ANY($2)", first.LeaseGeneration, ids)
	if err != nil {
		r.t.Fatalf("align generations: %v", err)
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
	// The claim's topics: the inbox's message types, the outbox's topics.
	topics := []string{"orders", "payments"}
	if q == leasing.Inbox {
		topics = []string{"order.created", "order.paid"}
	}
	switch r.c.intn(6) {
	case 0:
		req.Topics = topics[:1]
	case 1:
		req.Topics = topics
	case 2:
		req.ExceptTopics = topics[1:]
	}
	r.log("%s claim owner=%s batch=%d lease=%s tenant=%q topics=%q except=%q", q, req.Owner, req.BatchSize, req.LeaseFor, req.TenantID, req.Topics, req.ExceptTopics)
	ml, merr := r.mem[q].Claim(r.ctx, req)
	pl, perr := r.pg[q].Claim(r.ctx, req)
	r.same("claim error", errKind(merr), errKind(perr))
	r.same("claim leases", normLeases(ml), normLeases(pl))
	r.seen["claimed"] += len(ml)
	for _, l := range ml {
		if l.Attempt > 1 {
			r.seen["claimed again"]++
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
		switch name {
		case "fail":
			return s.Fail(r.ctx, fs...)
		case "release-after":
			return s.ReleaseAfter(r.ctx, fs...)
		}
		return s.DeadLetter(r.ctx, fs...)
	}
}

func (r *diffRun) fail(q leasing.Queue) { r.write(q, "fail", r.failures("fail", true)) }
func (r *diffRun) releaseAfter(q leasing.Queue) {
	r.write(q, "release-after", r.failures("release-after", true))
}
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
