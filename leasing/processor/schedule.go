package processor

import (
	"container/heap"
	"time"
)

// scheduleTick is the granularity of early-claim deadlines: a deadline is
// rounded up to the next tick, so that deadlines within one tick share a
// claim, which comes at most one tick after each of them.
const scheduleTick = time.Millisecond

// schedule is the claim loop's timetable: the next poll, and the deadlines
// at which a message may become due before or after it (a retry's backoff
// ending, a keyed successor promoted, a release). A deadline is kept until
// a claim starts at or after it, whatever else wakes the loop meanwhile, so
// that no request to claim early is lost. Times are the processor's
// monotonic clock; the zero schedule polls at once. Not safe for
// concurrent use: only the loop goroutine touches it.
type schedule struct {
	pollAt time.Time
	origin time.Time          // ticks count from here; set by the first deadline
	early  tickHeap           // deadlines, in ticks since origin, without duplicates
	queued map[int64]struct{} // the ticks in early
}

// addDeadline asks for a claim at or soon after at (within scheduleTick).
func (s *schedule) addDeadline(at time.Time) {
	if s.origin.IsZero() {
		s.origin = at
		s.queued = map[int64]struct{}{}
	}
	d := at.Sub(s.origin)
	t := int64(d / scheduleTick) // truncated towards zero, then rounded up
	if d > time.Duration(t)*scheduleTick {
		t++
	}
	if _, ok := s.queued[t]; ok {
		return
	}
	s.queued[t] = struct{}{}
	heap.Push(&s.early, t)
}

// next returns when the loop claims next: at the next poll or at the
// earliest deadline, whichever comes first.
func (s *schedule) next() time.Time {
	if len(s.early) > 0 {
		if at := s.tickTime(s.early[0]); at.Before(s.pollAt) {
			return at
		}
	}
	return s.pollAt
}

// claimed records a claim that started at sent: every deadline at or
// before sent is met. The next poll is at pollAt.
func (s *schedule) claimed(sent, pollAt time.Time) {
	for len(s.early) > 0 && !s.tickTime(s.early[0]).After(sent) {
		delete(s.queued, heap.Pop(&s.early).(int64))
	}
	s.pollAt = pollAt
}

// deadlines returns how many deadlines wait for a claim.
func (s *schedule) deadlines() int { return len(s.early) }

func (s *schedule) tickTime(t int64) time.Time { return s.origin.Add(time.Duration(t) * scheduleTick) }

// tickHeap is a min-heap of ticks (container/heap).
type tickHeap []int64

func (h tickHeap) Len() int           { return len(h) }
func (h tickHeap) Less(i, j int) bool { return h[i] < h[j] }
func (h tickHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *tickHeap) Push(x any)        { *h = append(*h, x.(int64)) }
func (h *tickHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}
