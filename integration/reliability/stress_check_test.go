package reliability_test

import (
	"context"
	"encoding/json"
	"sort"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/leasing"
)

// stressResult is what a run counted.
type stressResult struct {
	cfg                  stressConfig
	elapsed              time.Duration
	completed, dead      int
	invocations          int
	byResult             map[string]int
	claims, reclaims     int
	phantomClaims        int // claims that committed but whose reply never arrived
	refused              map[string]int
	writesAfterReclaim   int
	unknownWrites        int // write calls that returned an error
	alreadyApplied       int
	renewed, renewLost   int
	kills                map[string]int
	dropped              int64
	workerCrashes        int
	restarts             int
	processorErrors      int64
	unstartedClaims      int
	maxAttemptsSeen      int
	callErrors           map[string]int
	firstErrors          map[string]string
	invocationsPerMsgMax int
	// deadEarly counts dead letters whose handler ran fewer than
	// maxAttempts times: attempts spent by claims it never saw.
	deadEarly int
	// exhausted counts messages dead-lettered without running the handler:
	// claimed past maxAttempts after attempts that ended without an outcome.
	exhausted int
	// Orphan sweeps: calls, rows their replies released, calls that
	// failed (and may have released rows all the same).
	sweeps, swept, sweepsFailed int
	// unreportedReleases counts the releases in the rows' attempt
	// histories that no reply reported: each under a release or sweep
	// call of the same owner that returned an error.
	unreportedReleases int
}

func (r stressResult) report(t *testing.T) {
	t.Logf("stress %s: %d messages, %d workers, lease %s, in %s (%.0f msg/s)",
		r.cfg.queue, r.cfg.messages, r.cfg.workers, r.cfg.lease, r.elapsed.Round(time.Millisecond), float64(r.cfg.messages)/r.elapsed.Seconds())
	t.Logf("  terminal: %d succeeded, %d dead-lettered, 0 lost, 0 in flight", r.completed, r.dead)
	t.Logf("  invocations: %d %v (max %d per message); claims %d (%d reclaims of an expired or lost lease, %d phantom: committed, reply lost; %d never started)",
		r.invocations, r.byResult, r.invocationsPerMsgMax, r.claims, r.reclaims, r.phantomClaims, r.unstartedClaims)
	t.Logf("  renews: %d renewed, %d lost; writes refused by the fence: %v; writes sent after a reclaim: %d (all refused); write calls with unknown outcome: %d; already_applied: %d",
		r.renewed, r.renewLost, r.refused, r.writesAfterReclaim, r.unknownWrites, r.alreadyApplied)
	t.Logf("  faults: backends terminated %v, replies dropped %d, worker crashes %d, server restarts %d; store call errors %v; processor OnError %d",
		r.kills, r.dropped, r.workerCrashes, r.restarts, r.callErrors, r.processorErrors)
	t.Logf("  orphan sweeps: %d calls released %d rows, %d calls failed; releases in the attempt histories that no reply reported: %d (each under a failed release or sweep of its owner)",
		r.sweeps, r.swept, r.sweepsFailed, r.unreportedReleases)
	t.Logf("  dead letters with fewer than %d handler runs (attempts burnt by claims whose reply never arrived): %d; dead-lettered as exhausted without a last run: %d", r.cfg.maxAttempts, r.deadEarly, r.exhausted)
	for op, e := range r.firstErrors {
		t.Logf("  first %s error: %.200s", op, e)
	}
}

// firstGenerations returns the lease generation of each row of queue q,
// read before any claim: the generation each row's claims count from
// (the enqueueing transaction's id).
func firstGenerations(t *testing.T, admin *pgx.Conn, q leasing.Queue) map[uuid.UUID]int64 {
	t.Helper()
	rows, err := admin.Query(context.Background(), "SELECT message_id, lease_generation FROM "+tableOf(q))
	require.NoError(t, err)
	starts := map[uuid.UUID]int64{}
	for rows.Next() {
		var id uuid.UUID
		var gen int64
		require.NoError(t, rows.Scan(&id, &gen))
		starts[id] = gen
	}
	require.NoError(t, rows.Err())
	return starts
}

// checkStress checks the invariants listed at the top of stress_test.go;
// starts holds each row's generation before its first claim.
func checkStress(t *testing.T, cfg stressConfig, admin *pgx.Conn, ids []uuid.UUID, starts map[uuid.UUID]int64, rec *stressRecorder, skew time.Duration) stressResult {
	t.Helper()
	ctx := context.Background()
	rec.mu.Lock()
	defer rec.mu.Unlock()
	res := stressResult{cfg: cfg, byResult: map[string]int{}, refused: map[string]int{}, callErrors: rec.callErrors,
		firstErrors: rec.firstErrors, renewed: rec.renewed, renewLost: rec.renewLost}

	// Final rows.
	type finalRow struct {
		status   string
		owner    string
		gen      int64
		attempts int
		history  []historyEntry // oldest first
		raw      string         // the attempts column, for failure messages
	}
	final := make(map[uuid.UUID]finalRow, len(ids))
	rows, err := admin.Query(ctx, "SELECT message_id, status, coalesce(lease_owner, ''), lease_generation, attempt_count FROM "+tableOf(cfg.queue))
	require.NoError(t, err)
	for rows.Next() {
		var id uuid.UUID
		var r finalRow
		require.NoError(t, rows.Scan(&id, &r.status, &r.owner, &r.gen, &r.attempts))
		final[id] = r
	}
	require.NoError(t, rows.Err())
	// The histories as the API reads them (Row.Attempts): a completed
	// row's last entry is read from its lease columns, not stored.
	for id, h := range histories(t, admin, cfg.queue) {
		r := final[id]
		raw, err := json.Marshal(h)
		require.NoError(t, err)
		r.raw = string(raw)
		require.NoError(t, json.Unmarshal(raw, &r.history), "attempts of %s", id)
		final[id] = r
	}
	require.Len(t, final, len(ids), "rows lost or added")
	succeeded := string(cfg.queue.Succeeded())
	for _, id := range ids {
		r, ok := final[id]
		require.True(t, ok, "message %s lost", id)
		switch r.status {
		case succeeded:
			res.completed++
		case "dead_lettered":
			res.dead++
		default:
			t.Fatalf("message %s ended %s, not terminal", id, r.status)
		}
	}

	// Claims per message.
	claimsOf := map[uuid.UUID][]claimEvent{}
	for _, c := range rec.claims {
		claimsOf[c.id] = append(claimsOf[c.id], c)
		if c.gen > 1 {
			res.reclaims++
		}
	}
	res.claims = len(rec.claims)
	seenClaim := map[[2]any]bool{}
	for id, cs := range claimsOf {
		for _, c := range cs {
			k := [2]any{id, c.gen}
			require.False(t, seenClaim[k], "generation %d of %s claimed twice", c.gen, id)
			seenClaim[k] = true
			require.LessOrEqual(t, c.gen, final[id].gen, "claim of a generation the row never reached")
		}
		res.phantomClaims += int(final[id].gen-starts[id]) - len(cs)
	}

	// Writes: the fence, refusals, and who wrote the terminal state.
	sort.Slice(rec.writes, func(i, j int) bool { return rec.writes[i].start.Before(rec.writes[j].start) })
	terminalBy := map[uuid.UUID]map[int64]bool{}
	releases := map[uuid.UUID]map[int64]string{}        // (id, generation) -> owner, of releases a reply reported
	unknownReleases := map[uuid.UUID]map[int64]string{} // the same, of release calls that returned an error
	for _, w := range rec.writes {
		if w.outcome == "" {
			res.unknownWrites++
			if w.kind == "release" {
				if unknownReleases[w.id] == nil {
					unknownReleases[w.id] = map[int64]string{}
				}
				unknownReleases[w.id][w.gen] = w.owner
			}
			continue
		}
		newer := false
		for _, c := range claimsOf[w.id] {
			if c.gen > w.gen && c.at.Before(w.start) {
				newer = true
				break
			}
		}
		if newer {
			res.writesAfterReclaim++
			// already_applied changes nothing either: it is the retry of a
			// write whose reply was lost after it had committed.
			require.Contains(t, []leasing.Outcome{leasing.OutcomeLost, leasing.OutcomeTerminal, leasing.OutcomeAlreadyApplied}, w.outcome,
				"%s of %s generation %d sent after generation >%d was claimed was not refused", w.kind, w.id, w.gen, w.gen)
		}
		switch w.outcome {
		case leasing.OutcomeLost, leasing.OutcomeTerminal, leasing.OutcomeNotFound:
			res.refused[string(w.outcome)]++
		case leasing.OutcomeAlreadyApplied:
			res.alreadyApplied++
		}
		if !w.outcome.Succeeded() {
			continue
		}
		switch w.kind {
		case "complete", "dead-letter":
			if terminalBy[w.id] == nil {
				terminalBy[w.id] = map[int64]bool{}
			}
			terminalBy[w.id][w.gen] = true
			r := final[w.id]
			require.Equal(t, r.gen, w.gen, "%s of %s succeeded for generation %d, but the row ended at %d", w.kind, w.id, w.gen, r.gen)
			require.Equal(t, r.owner, w.owner, "%s of %s", w.kind, w.id)
			want := succeeded
			if w.kind == "dead-letter" {
				want = "dead_lettered"
			}
			require.Equal(t, want, r.status, "%s of %s succeeded, but the row is %s", w.kind, w.id, r.status)
		case "release":
			if releases[w.id] == nil {
				releases[w.id] = map[int64]string{}
			}
			releases[w.id][w.gen] = w.owner
		}
	}
	for _, id := range ids {
		require.LessOrEqual(t, len(terminalBy[id]), 1, "message %s reached a terminal state under %d generations", id, len(terminalBy[id]))
	}

	// Sweeps: per message and owner, the releases their replies reported;
	// per owner, the sweeps that failed.
	swept := map[uuid.UUID]map[string]int{}
	sweepsFailed := map[string]int{}
	for _, sw := range rec.sweeps {
		res.sweeps++
		if sw.failed {
			res.sweepsFailed++
			sweepsFailed[sw.owner]++
			continue
		}
		for _, id := range sw.released {
			res.swept++
			if swept[id] == nil {
				swept[id] = map[string]int{}
			}
			swept[id][sw.owner]++
		}
	}

	// attempt_count: each claim adds one, each release (Release, or an
	// orphan sweep) returns it. The recorder cannot count every release: a
	// call whose deadline passed, or whose reply was lost, may have
	// committed (under load a sweep's 300 ms deadline passes while the
	// server commits). The row's attempt history can: one entry per
	// generation, written by the statement that ended it, with the
	// attempt number it ran as. So the counter is checked against the
	// history, exactly, and the history against the recorder: every
	// reported release is in it, and every release in it that no reply
	// reported was written under a call of its owner that returned an
	// error. checkReleases has the details.
	for _, id := range ids {
		r := final[id]
		res.unreportedReleases += checkReleases(t, id, releaseFacts{
			start: starts[id], gen: r.gen, attempts: r.attempts, history: r.history, raw: r.raw,
			reported: releases[id], unknown: unknownReleases[id], swept: swept[id], sweepsFailed: sweepsFailed,
		})
	}

	// Invocations.
	invOf := map[uuid.UUID][]invocation{}
	for _, inv := range rec.invocations {
		invOf[inv.id] = append(invOf[inv.id], inv)
		res.byResult[inv.result]++
		res.maxAttemptsSeen = max(res.maxAttemptsSeen, inv.attempt)
	}
	res.invocations = len(rec.invocations)
	for _, id := range ids {
		invs := invOf[id]
		res.invocationsPerMsgMax = max(res.invocationsPerMsgMax, len(invs))
		r := final[id]
		started := map[int64]bool{}
		for _, inv := range invs {
			require.False(t, started[inv.gen], "%s generation %d handled twice", id, inv.gen)
			started[inv.gen] = true
			require.True(t, seenClaim[[2]any{id, inv.gen}], "%s generation %d handled without a recorded claim", id, inv.gen)
		}
		for _, c := range claimsOf[id] {
			if _, released := releases[id][c.gen]; !started[c.gen] && !released {
				res.unstartedClaims++
			}
		}
		// A released lease gave its attempt back: its handler never ran
		// (the processor releases leases it has not started, the sweep
		// leases it never saw).
		for _, e := range r.history {
			if e.Outcome == "released" {
				require.False(t, started[e.Generation], "%s generation %d was released, returning its attempt, but its handler ran; attempts %s", id, e.Generation, r.raw)
			}
		}
		if len(terminalBy[id]) == 1 {
			// The generation that wrote the terminal state ran its handler
			// to the matching end.
			var last *invocation
			for i := range invs {
				if invs[i].gen == r.gen {
					last = &invs[i]
				}
			}
			if last == nil {
				// Claimed past MaxAttempts after attempts that ended without
				// an outcome: dead-lettered without running the handler.
				require.Equal(t, "dead_lettered", r.status, "%s: terminal state written by generation %d without an invocation", id, r.gen)
				require.Greater(t, r.attempts, cfg.maxAttempts, "%s: dead-lettered without an invocation before its attempts ran out", id)
				res.exhausted++
				continue
			}
			if r.status == succeeded {
				require.Equal(t, "ok", last.result, "%s completed but its handler returned %s", id, last.result)
			} else {
				require.Equal(t, "failed", last.result, "%s dead-lettered but its handler returned %s", id, last.result)
				require.GreaterOrEqual(t, last.attempt, cfg.maxAttempts)
				if len(invs) < cfg.maxAttempts {
					res.deadEarly++
				}
			}
		}
	}

	// Into the table, then the overlap check in SQL.
	copyRows := make([][]any, 0, len(rec.invocations))
	for _, inv := range rec.invocations {
		// Lease expiry is the database clock; invocation times are ours.
		valid := rec.expiry[[2]any{inv.id, inv.gen}].Add(-skew)
		copyRows = append(copyRows, []any{inv.id, inv.gen, inv.worker, inv.start, inv.end, valid, inv.result, inv.attempt})
	}
	_, err = admin.CopyFrom(ctx, pgx.Identifier{"stress_invocations"},
		[]string{"message_id", "lease_generation", "worker", "started_at", "finished_at", "lease_valid_until", "result", "attempt"},
		pgx.CopyFromRows(copyRows))
	require.NoError(t, err, "one invocation per (message, generation)")
	var overlaps int
	var example string
	err = admin.QueryRow(ctx, `
		SELECT count(*), coalesce(min(a.message_id::text || ' gen ' || a.lease_generation || '/' || b.lease_generation), '')
		FROM stress_invocations AS a
		JOIN stress_invocations AS b
		  ON b.message_id = a.message_id AND b.lease_generation > a.lease_generation
		WHERE b.started_at < least(a.finished_at, a.lease_valid_until)`).Scan(&overlaps, &example)
	require.NoError(t, err)
	require.Zero(t, overlaps, "invocations overlapped while both held a valid lease, e.g. %s", example)
	return res
}

// histories returns the attempt history of every row of queue q, read
// with leasing.Postgres.List on a pool of admin's database.
func histories(t *testing.T, admin *pgx.Conn, q leasing.Queue) map[uuid.UUID][]leasing.Attempt {
	t.Helper()
	pool, err := pgxpool.New(t.Context(), admin.Config().ConnString())
	require.NoError(t, err)
	defer pool.Close()
	store, err := leasing.NewPostgres(pool, q, leasing.PostgresOptions{})
	require.NoError(t, err)
	out := map[uuid.UUID][]leasing.Attempt{}
	req := leasing.ListRequest{Limit: leasing.MaxBatchSize}
	for {
		page, err := store.List(t.Context(), req)
		require.NoError(t, err)
		for _, row := range page.Rows {
			out[row.ID] = row.Attempts
		}
		if page.Next.IsZero() {
			return out
		}
		req.After = page.Next
	}
}

// historyEntry is what the check reads of one entry of a row's attempts
// (leasing.Attempt).
type historyEntry struct {
	Attempt    int    `json:"attempt"`
	Generation int64  `json:"generation"`
	Owner      string `json:"owner"`
	Outcome    string `json:"outcome"`
	Operator   bool   `json:"operator"`
}

// checkT is the part of *testing.T the checks use.
type checkT interface {
	require.TestingT
	Helper()
}

// releaseFacts is what the check knows about one message's releases.
type releaseFacts struct {
	start    int64 // the row's lease_generation before its first claim
	gen      int64 // the row's lease_generation
	attempts int   // the row's attempt_count
	history  []historyEntry
	raw      string
	// Generation -> owner: releases a reply reported applied (or already
	// applied), and release calls that returned an error.
	reported, unknown map[int64]string
	swept             map[string]int // owner -> its sweeps whose reply released this message
	sweepsFailed      map[string]int // owner -> its sweeps that returned an error (any message)
}

// checkReleases checks one terminal message's attempt_count against its
// attempt history, and the history against what the recorder saw, and
// returns how many of the history's releases no reply reported.
//
// The history has one entry per generation, each written by the
// statement that ended that lease (a terminal or failed write, a release
// or sweep, or the claim that reclaimed it after it expired) with the
// attempt number the lease ran as; it keeps the latest
// leasing.AttemptHistoryLimit entries. So:
//   - its generations run without a gap up to the row's generation (from
//     1 when nothing was dropped), the last one terminal;
//   - each generation's attempt is the previous one's plus one, or the
//     same when the previous lease was released; attempt_count is the last
//     one's, and (untruncated) generations minus releases;
//   - every release a reply reported is in it, under the same owner, and
//     (untruncated) each owner's sweeps whose reply released the message
//     are in it;
//   - each release in it that no reply reported is explained by a call of
//     its owner that returned an error: a release of that very lease, or
//     one of the owner's failed sweeps (a sweep releases a message at most
//     once).
func checkReleases(t checkT, id uuid.UUID, f releaseFacts) (unreported int) {
	t.Helper()
	h := f.history
	require.NotEmpty(t, h, "%s: no attempt history", id)
	complete := len(h) < leasing.AttemptHistoryLimit
	first := h[0].Generation
	for i, e := range h {
		require.False(t, e.Operator, "%s: operator entry in attempts %s", id, f.raw)
		if i > 0 {
			require.Equal(t, h[i-1].Generation+1, e.Generation, "%s: generations in attempts %s", id, f.raw)
			want := h[i-1].Attempt + 1
			if h[i-1].Outcome == "released" {
				want--
			}
			require.Equal(t, want, e.Attempt, "%s: attempt of generation %d in attempts %s", id, e.Generation, f.raw)
		}
	}
	last := h[len(h)-1]
	require.Equal(t, f.gen, last.Generation, "%s: last generation in attempts %s", id, f.raw)
	require.NotEqual(t, "released", last.Outcome, "%s: attempts %s", id, f.raw)
	require.Equal(t, last.Attempt, f.attempts, "%s: attempt_count vs the last generation's attempt in attempts %s", id, f.raw)
	releasedIn := map[string]int{} // owner -> releases in the history that no reply reported
	explained := map[string]int{}  // of those, under a release call of that lease that returned an error
	released := 0
	for _, e := range h {
		if e.Outcome != "released" {
			continue
		}
		released++
		if _, ok := f.reported[e.Generation]; ok {
			continue
		}
		releasedIn[e.Owner]++
		if f.unknown[e.Generation] == e.Owner {
			explained[e.Owner]++
		}
	}
	if complete {
		require.Equal(t, f.start+1, first, "%s: first generation in attempts %s", id, f.raw)
		require.Equal(t, 1, h[0].Attempt, "%s: first attempt in attempts %s", id, f.raw)
		require.Equal(t, int(f.gen-f.start)-released, f.attempts, "message %s: attempt_count vs generations minus releases in attempts %s", id, f.raw)
	}
	for g, owner := range f.reported {
		if g < first {
			continue // dropped from the history
		}
		e := h[g-first]
		require.Equal(t, "released", e.Outcome, "%s: generation %d's release was reported applied; attempts %s", id, g, f.raw)
		require.Equal(t, owner, e.Owner, "%s: generation %d's release; attempts %s", id, g, f.raw)
	}
	owners := map[string]bool{}
	for o := range releasedIn {
		owners[o] = true
	}
	for o := range f.swept {
		owners[o] = true
	}
	for o := range owners {
		if complete {
			require.LessOrEqual(t, f.swept[o], releasedIn[o], "%s: %s's sweeps reported releasing it %d times; attempts %s", id, o, f.swept[o], f.raw)
		}
		extra := releasedIn[o] - f.swept[o]
		require.LessOrEqual(t, extra, explained[o]+f.sweepsFailed[o],
			"%s: %d releases by %s in the history that no reply reported, with %d of its release calls of those leases and %d of its sweeps failed; attempts %s",
			id, extra, o, explained[o], f.sweepsFailed[o], f.raw)
		unreported += max(extra, 0)
	}
	return unreported
}

// clockSkew estimates the database clock minus this process's clock, from
// the best of a few round trips.
func clockSkew(t *testing.T, admin *pgx.Conn) time.Duration {
	t.Helper()
	best, skew := time.Duration(1<<62), time.Duration(0)
	for range 5 {
		before := time.Now()
		var db time.Time
		require.NoError(t, admin.QueryRow(context.Background(), "SELECT clock_timestamp()").Scan(&db))
		after := time.Now()
		if rtt := after.Sub(before); rtt < best {
			best, skew = rtt, db.Sub(before.Add(rtt/2))
		}
	}
	return skew
}
