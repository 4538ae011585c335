package processor

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestHandoff: leases put for sleeping workers wake one worker, which
// wakes the next once it has taken a lease while more are queued, and no
// more; a lease put while every awake worker is in its call wakes a
// sleeping one; close lets the workers return.
func TestHandoff(t *testing.T) {
	t.Parallel()
	var q handoff
	hs := []*heldLease{{}, {}, {}}
	asleep := func() int {
		q.mu.Lock()
		defer q.mu.Unlock()
		return len(q.idle)
	}
	// Three workers fall asleep on an empty handoff. Each call lasts
	// until release is closed, as a slow handler's.
	taken := make(chan *heldLease, 10)
	release := make(chan struct{})
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() {
			wake := make(chan struct{}, 1)
			for {
				h, ok := q.take(wake)
				if !ok {
					return
				}
				taken <- h
				<-release
			}
		})
	}
	waitUntil(t, func() bool { return asleep() == 3 }, "three workers asleep")

	// Two leases: one worker woken by put, the second by the first.
	q.put(hs[0], hs[1])
	got := []*heldLease{<-taken, <-taken}
	require.ElementsMatch(t, hs[:2], got)
	waitUntil(t, func() bool { return asleep() == 1 }, "the third worker sleeps on")
	q.mu.Lock()
	require.False(t, q.waking, "no wake is on its way once both took theirs")
	q.mu.Unlock()

	// A lease queued while no worker is woken and every awake one is in
	// its call: put wakes the sleeping one.
	q.put(hs[2])
	require.Same(t, hs[2], <-taken)
	require.Equal(t, 0, asleep())

	// Close: workers in their calls take nothing more and return.
	q.close()
	close(release)
	wg.Wait()
	require.Empty(t, taken)
}

// TestHandoffFastCalls: a worker that returns from its call before
// others are woken takes the queued leases itself; a closed handoff still
// hands out what was queued.
func TestHandoffFastCalls(t *testing.T) {
	t.Parallel()
	var q handoff
	hs := make([]*heldLease, 5)
	for i := range hs {
		hs[i] = &heldLease{}
	}
	q.put(hs...)
	q.close()
	wake := make(chan struct{}, 1)
	for i := range hs {
		h, ok := q.take(wake)
		require.True(t, ok)
		require.Same(t, hs[i], h, "in the order put")
	}
	_, ok := q.take(wake)
	require.False(t, ok, "closed and empty")
}

// waitUntil waits up to ten seconds for cond.
func waitUntil(t *testing.T, cond func() bool, msg string) {
	t.Helper()
	require.Eventually(t, cond, 10*time.Second, time.Millisecond, msg)
}
