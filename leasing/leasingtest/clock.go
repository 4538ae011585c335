// Package leasingtest is the contract suite every leasing.Store
// implementation must pass, and the manual clock it steps time with.
package leasingtest

import (
	"sync"
	"time"
)

// Clock is a manual clock for stores under test: it moves only when Advance
// is called. Safe for concurrent use. Times are UTC, to the microsecond.
type Clock struct {
	mu  sync.Mutex
	now time.Time
}

// NewClock returns a clock reading start (truncated to the microsecond).
func NewClock(start time.Time) *Clock {
	return &Clock{now: start.UTC().Truncate(time.Microsecond)}
}

// Now returns the clock's current reading.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Advance moves the clock forward by d (truncated to the microsecond).
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d.Truncate(time.Microsecond))
}
