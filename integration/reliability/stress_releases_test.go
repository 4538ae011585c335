package reliability_test

import (
	"fmt"
	"runtime"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/leasing"
)

// failureT records the first failure of a check and stops it, as
// t.FailNow does.
type failureT struct{ msg string }

func (f *failureT) Errorf(format string, args ...any) {
	if f.msg == "" {
		f.msg = fmt.Sprintf(format, args...)
	}
}
func (f *failureT) FailNow() { runtime.Goexit() }
func (f *failureT) Helper()  {}

// runCheckReleases runs checkReleases on its own goroutine and returns its
// result and first failure ("" when it passed).
func runCheckReleases(f releaseFacts) (unreported int, failure string) {
	ft := &failureT{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		unreported = checkReleases(ft, uuid.Nil, f)
	}()
	<-done
	return unreported, ft.msg
}

// TestStressCheckReleases: the stress run's attempt_count check accepts a
// release that no reply reported when, and only when, a call of the same
// owner that could have made it returned an error, and still fails on a
// counter the releases do not explain. The first case is the failure seen
// under load: an orphan sweep committed after its 300 ms deadline had
// passed, so the recorder, which counted releases from replies, expected
// attempt_count one higher (generations 3 minus 0 reported releases) than
// the row's 2.
func TestStressCheckReleases(t *testing.T) {
	t.Parallel()
	e := func(gen int64, owner, outcome string, attempt int) historyEntry {
		return historyEntry{Attempt: attempt, Generation: gen, Owner: owner, Outcome: outcome}
	}
	// Generation 2 was a claim by w03 whose reply never arrived; w03's
	// sweep released it.
	swept := []historyEntry{e(1, "w01", "failed", 1), e(2, "w03", "released", 2), e(3, "w02", "completed", 2)}
	base := releaseFacts{gen: 3, attempts: 2, history: swept, raw: "[...]"}
	with := func(change func(*releaseFacts)) releaseFacts {
		f := base
		change(&f)
		return f
	}
	// 20 entries from generation 11 (older ones dropped), every one a
	// failure but generation 15, released by w03's failed sweep.
	var long []historyEntry
	for g, a := int64(11), 8; g <= 30; g++ {
		outcome := "failed"
		switch g {
		case 15:
			outcome = "released"
		case 30:
			outcome = "dead_lettered"
		}
		long = append(long, e(g, "w01", outcome, a))
		if g == 15 {
			long[len(long)-1].Owner = "w03"
		} else {
			a++
		}
	}
	require.Len(t, long, leasing.AttemptHistoryLimit)
	for _, tc := range []struct {
		name       string
		facts      releaseFacts
		unreported int
		fails      string // a fragment of the failure; "" when the check passes
	}{
		{name: "sweep failed after committing", facts: with(func(f *releaseFacts) { f.sweepsFailed = map[string]int{"w03": 1} }), unreported: 1},
		{name: "sweep reported", facts: with(func(f *releaseFacts) { f.swept = map[string]int{"w03": 1} })},
		{name: "release call failed after committing", facts: with(func(f *releaseFacts) { f.unknown = map[int64]string{2: "w03"} }), unreported: 1},
		{name: "release reported", facts: with(func(f *releaseFacts) { f.reported = map[int64]string{2: "w03"} })},
		{name: "truncated history", facts: releaseFacts{gen: 30, attempts: 26, history: long, sweepsFailed: map[string]int{"w03": 1}}, unreported: 1},

		{name: "no call explains the release", facts: base, fails: "releases by w03 in the history that no reply reported"},
		{name: "only another owner's sweep failed", facts: with(func(f *releaseFacts) { f.sweepsFailed = map[string]int{"w01": 1} }), fails: "releases by w03"},
		{name: "failed release of another lease", facts: with(func(f *releaseFacts) { f.unknown = map[int64]string{3: "w03"} }), fails: "releases by w03"},
		{name: "one failed sweep, two unreported releases", facts: releaseFacts{gen: 4, attempts: 2, sweepsFailed: map[string]int{"w03": 1},
			history: []historyEntry{e(1, "w03", "released", 1), e(2, "w03", "released", 1), e(3, "w01", "failed", 1), e(4, "w01", "completed", 2)}}, fails: "2 releases by w03"},
		{name: "reported sweep not in the history", facts: with(func(f *releaseFacts) { f.swept = map[string]int{"w03": 1, "w01": 1} }), fails: "w01's sweeps reported releasing it 1 times"},
		{name: "reported release not in the history", facts: with(func(f *releaseFacts) { f.reported = map[int64]string{1: "w01"}; f.swept = map[string]int{"w03": 1} }), fails: "generation 1's release was reported applied"},
		{name: "attempt_count one low", facts: with(func(f *releaseFacts) { f.attempts = 1; f.swept = map[string]int{"w03": 1} }), fails: "attempt_count vs the last generation's attempt"},
		{name: "release kept its attempt", facts: with(func(f *releaseFacts) {
			f.history = []historyEntry{e(1, "w01", "failed", 1), e(2, "w03", "released", 2), e(3, "w02", "completed", 3)}
			f.attempts = 3
			f.swept = map[string]int{"w03": 1}
		}), fails: "attempt of generation 3"},
		{name: "claim counted no attempt", facts: releaseFacts{gen: 2, attempts: 1, history: []historyEntry{e(1, "w01", "failed", 1), e(2, "w01", "completed", 1)}}, fails: "attempt of generation 2"},
		{name: "generation without an entry", facts: releaseFacts{gen: 3, attempts: 2, history: []historyEntry{e(1, "w01", "failed", 1), e(3, "w01", "completed", 2)}}, fails: "generations in attempts"},
		{name: "history behind the row", facts: with(func(f *releaseFacts) { f.gen = 4; f.swept = map[string]int{"w03": 1} }), fails: "last generation in attempts"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			unreported, failure := runCheckReleases(tc.facts)
			if tc.fails == "" {
				require.Empty(t, failure)
				require.Equal(t, tc.unreported, unreported)
				return
			}
			require.Contains(t, failure, tc.fails)
		})
	}
}
