package reliability_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/leasingtest"
	"github.com/leasestore/leasestore/leasing/processor"
)

// TestFaultPausedWorker: a worker paused past its lease (a GC pause, a
// stopped VM) and then resuming. Deterministic with a pinned clock.
func TestFaultPausedWorker(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const lease = 30 * time.Second

	setup := func(t *testing.T, q leasing.Queue) (*leasingtest.Clock, *pgx.Conn, leasing.Store, leasing.Store, []leasing.Lease) {
		clock := leasingtest.NewClock(leasingtest.Start)
		url := freshURL(t)
		a := openStore(t, url, q, leasing.PostgresOptions{Now: clock.Now})
		b := openStore(t, url, q, leasing.PostgresOptions{Now: clock.Now})
		_, err := a.Enqueue(ctx, leasing.NewMessage{}, leasing.NewMessage{}, leasing.NewMessage{})
		require.NoError(t, err)
		held, err := a.Claim(ctx, leasing.ClaimRequest{Owner: "paused", BatchSize: 3, LeaseFor: lease})
		require.NoError(t, err)
		require.Len(t, held, 3)
		return clock, adminConn(t, url), a, b, held
	}
	failures := func(ls []leasing.Lease) []leasing.Failure {
		fs := make([]leasing.Failure, len(ls))
		for i, l := range ls {
			fs[i] = leasing.Failure{Lease: l, Error: "late"}
		}
		return fs
	}
	// allWrites runs every write of the paused worker and returns the
	// outcomes of each.
	allWrites := func(t *testing.T, s leasing.Store, held []leasing.Lease) map[string][]leasing.Outcome {
		out := map[string][]leasing.Outcome{}
		renew, err := s.Renew(ctx, lease, held...)
		require.NoError(t, err)
		require.Empty(t, renew.Renewed)
		for _, w := range []struct {
			name string
			do   func() (leasing.WriteResult, error)
		}{
			{"release", func() (leasing.WriteResult, error) { return s.Release(ctx, held...) }},
			{"complete", func() (leasing.WriteResult, error) { return s.Complete(ctx, held...) }},
			{"fail", func() (leasing.WriteResult, error) { return s.Fail(ctx, failures(held)...) }},
			{"dead-letter", func() (leasing.WriteResult, error) { return s.DeadLetter(ctx, failures(held)...) }},
		} {
			res, err := w.do()
			require.NoError(t, err, w.name)
			for _, o := range res.Outcomes {
				out[w.name] = append(out[w.name], o.Outcome)
			}
		}
		return out
	}

	for _, q := range queuesBoth {
		// Reclaimed while paused: every write of the resumed worker is lost
		// and changes nothing; the new owner finishes.
		t.Run(string(q)+"/ReclaimedWhilePaused", func(t *testing.T) {
			t.Parallel()
			clock, admin, a, b, held := setup(t, q)
			clock.Advance(lease)
			current, err := b.Claim(ctx, leasing.ClaimRequest{Owner: "paused", BatchSize: 3, LeaseFor: lease}) // same owner name: only the generation fences
			require.NoError(t, err)
			require.Len(t, current, 3)
			before := tableDigest(t, admin)
			lost := []leasing.Outcome{leasing.OutcomeLost, leasing.OutcomeLost, leasing.OutcomeLost}
			for name, outs := range allWrites(t, a, held) {
				require.Equal(t, lost, outs, name)
			}
			require.Equal(t, before, tableDigest(t, admin))
			res, err := b.Complete(ctx, current...)
			require.NoError(t, err)
			require.Equal(t, 3, res.Count(leasing.OutcomeApplied))
		})
		// Reclaimed and finished while paused: terminal rows say terminal,
		// the failed one (due again later) says lost.
		t.Run(string(q)+"/ReclaimedAndFinishedWhilePaused", func(t *testing.T) {
			t.Parallel()
			clock, admin, a, b, held := setup(t, q)
			clock.Advance(lease + time.Second)
			current, err := b.Claim(ctx, leasing.ClaimRequest{Owner: "b", BatchSize: 3, LeaseFor: lease})
			require.NoError(t, err)
			_, err = b.Complete(ctx, current[0])
			require.NoError(t, err)
			_, err = b.Fail(ctx, leasing.Failure{Lease: current[1], RetryAfter: time.Hour})
			require.NoError(t, err)
			_, err = b.DeadLetter(ctx, leasing.Failure{Lease: current[2]})
			require.NoError(t, err)
			before := tableDigest(t, admin)
			want := []leasing.Outcome{leasing.OutcomeTerminal, leasing.OutcomeLost, leasing.OutcomeTerminal}
			for name, outs := range allWrites(t, a, held) {
				require.Equal(t, want, outs, name)
			}
			require.Equal(t, before, tableDigest(t, admin))
		})
		// Expired but nobody reclaimed yet: renew is refused (the lease
		// expired), but an outcome write still applies: the store fences by
		// generation, not by time (contract Fencing/ExpiredButNotReclaimedMayFinish).
		// A Processor never gets here: it gives a lease up once its local
		// deadline passes (TestFaultPausedProcessor).
		t.Run(string(q)+"/ExpiredNotReclaimed", func(t *testing.T) {
			t.Parallel()
			clock, _, a, _, held := setup(t, q)
			clock.Advance(2 * lease)
			renew, err := a.Renew(ctx, lease, held...)
			require.NoError(t, err)
			require.Len(t, renew.Lost, 3)
			res, err := a.Complete(ctx, held...)
			require.NoError(t, err)
			require.Equal(t, 3, res.Count(leasing.OutcomeApplied))
		})
	}
}

// TestFaultPausedProcessor: a processor whose process freezes (no store
// call gets through, its handler is stuck) for longer than its lease. Another
// processor reclaims and completes the message. When the first resumes and
// its handler returns success, none of its writes may apply.
func TestFaultPausedProcessor(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := freshURL(t)
	admin := adminConn(t, url)
	const lease = 400 * time.Millisecond
	rec := newStressRecorder()
	open := func(name string) *recordingStore {
		pg, err := leasing.NewPostgres(newPool(t, url, "", 2), leasing.Inbox, leasing.PostgresOptions{})
		require.NoError(t, err)
		return &recordingStore{Store: pg, rec: rec, worker: name}
	}
	opts := func(name string) processor.Options {
		return processor.Options{Owner: name, BatchSize: 1, Concurrency: 1, LeaseDuration: lease,
			HeartbeatInterval: lease / 4, PollInterval: 20 * time.Millisecond, ShutdownGrace: time.Second}
	}
	res, err := open("loader").Enqueue(ctx, leasing.NewMessage{})
	require.NoError(t, err)
	id := res.IDs[0]

	// The first processor takes the message and freezes inside the handler.
	sa := open("a")
	started, resume := make(chan struct{}), make(chan struct{})
	var once sync.Once
	pa, err := processor.New(sa, func(context.Context, leasing.Lease) error {
		once.Do(func() { close(started) })
		<-resume // frozen: ignores its context, like a paused process
		return nil
	}, opts("a"))
	require.NoError(t, err)
	go func() { _ = pa.Run(ctx) }()
	<-started
	sa.pause()

	// Its lease expires; a second processor reclaims and completes.
	pb, err := processor.New(open("b"), func(context.Context, leasing.Lease) error { return nil }, opts("b"))
	require.NoError(t, err)
	go func() { _ = pb.Run(ctx) }()
	require.Eventually(t, func() bool {
		status, _ := rowState(t, admin, leasing.Inbox, id)
		return status == "completed"
	}, 10*time.Second, 10*time.Millisecond)
	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	require.NoError(t, pb.Stop(stopCtx))
	before := tableDigest(t, admin)

	// The first resumes: its handler succeeds, its store calls get through.
	sa.resume()
	close(resume)
	require.NoError(t, pa.Stop(stopCtx))
	require.Equal(t, before, tableDigest(t, admin), "the resumed processor changed the row")

	rec.mu.Lock()
	defer rec.mu.Unlock()
	var gens []int64
	for _, c := range rec.claims {
		gens = append(gens, c.gen)
	}
	require.Len(t, gens, 2)
	require.Equal(t, gens[0]+1, gens[1], "a claimed a generation, b reclaimed the next")
	for _, w := range rec.writes {
		if w.gen == gens[0] {
			require.False(t, w.outcome.Succeeded(), "the paused processor's %s applied: %s", w.kind, w.outcome)
		}
	}
	t.Logf("writes of the resumed processor: %d (the processor gave the lease up locally before writing)", countGen(rec.writes, 1))
}

func countGen(ws []writeEvent, gen int64) int {
	n := 0
	for _, w := range ws {
		if w.gen == gen {
			n++
		}
	}
	return n
}
