package processor

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestScheduleKeepsEveryDeadline drives the claim loop's schedule through
// random runs on a virtual clock: deadlines requested at random, claims
// started by the schedule's own timer and by wake-ups at random moments,
// polls reset to random waits. Whatever the order, every deadline is met by
// a claim that starts at or after it and at most one tick later, and a met
// deadline is dropped.
func TestScheduleKeepsEveryDeadline(t *testing.T) {
	t.Parallel()
	for seed := range uint64(200) {
		rng := rand.New(rand.NewPCG(seed, 1))
		start := time.Unix(0, 0).Add(time.Duration(rng.IntN(1000)) * time.Microsecond)
		now := start
		var s schedule
		s.claimed(now, now.Add(10*time.Second)) // the loop's first claim
		var unmet []time.Time                   // deadlines no claim has met yet
		var all []time.Time                     // every deadline asked for
		claim := func(at time.Time) {
			now = at
			var left []time.Time
			for _, d := range unmet {
				if d.After(now) {
					left = append(left, d)
					continue
				}
				require.False(t, now.After(d.Add(scheduleTick)), "seed %d: deadline %v met late at %v", seed, d.Sub(start), now.Sub(start))
			}
			unmet = left
			wait := []time.Duration{2 * time.Millisecond, 64 * time.Millisecond, 10 * time.Second}[rng.IntN(3)]
			s.claimed(now, now.Add(wait))
			ticks := map[time.Time]bool{} // the rounded deadlines the claim has not passed
			for _, d := range all {
				q := d.Sub(s.origin)
				r := q.Truncate(scheduleTick) // towards zero
				if r < q {
					r += scheduleTick
				}
				if up := s.origin.Add(r); up.After(now) {
					ticks[up] = true
				}
			}
			require.Equal(t, len(ticks), s.deadlines(), "seed %d: met deadlines are dropped, the others kept", seed)
		}
		for range 300 {
			switch op := rng.IntN(10); {
			case op < 5: // a write asks for a claim within 0..300ms
				d := now.Add(time.Duration(rng.Int64N(int64(300 * time.Millisecond))))
				unmet = append(unmet, d)
				all = append(all, d)
				s.addDeadline(d)
			case op < 7: // a wake-up or a freed slot: claim now or a little later
				at := now.Add(time.Duration(rng.Int64N(int64(5 * time.Millisecond))))
				if next := s.next(); at.After(next) {
					at = next // the timer fires first
				}
				claim(at)
			default: // the timer fires
				next := s.next()
				require.False(t, next.After(s.pollAt), "seed %d: the poll is never postponed", seed)
				for _, d := range unmet {
					require.False(t, next.After(d.Add(scheduleTick)), "seed %d: deadline %v would be met late", seed, d.Sub(start))
				}
				claim(later(now, next))
			}
		}
	}
}

// later returns the later of a and b: a timer reset to the past fires now.
func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
