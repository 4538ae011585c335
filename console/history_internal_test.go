package console

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/leasing"
)

func TestHistoryRingKeepsTheLastHour(t *testing.T) {
	h := newHistory(20 * time.Minute) // room for 4 samples
	t0 := time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC)
	for i := range 6 {
		h.add(sample{At: t0.Add(time.Duration(i) * 20 * time.Minute), Depth: int64(i)})
	}
	var depths []int64
	for _, s := range h.samples() {
		depths = append(depths, s.Depth)
	}
	require.Equal(t, []int64{2, 3, 4, 5}, depths)
}

func TestHistoryRateUnknownWhenRowsDeleted(t *testing.T) {
	c := &Console{queues: []leasing.Queue{leasing.Inbox}}
	c.sampler.every = time.Minute
	c.sampler.hist = map[leasing.Queue]*history{leasing.Inbox: newHistory(time.Minute)}
	t0 := time.Now().Add(-3 * time.Minute)
	for i, done := range []int64{10, 40, 5} { // 30 per minute, then rows deleted
		c.record(leasing.Inbox, leasing.Stats{Depth: map[leasing.Status]int64{leasing.StatusCompleted: done, leasing.StatusPending: 7}},
			t0.Add(time.Duration(i)*time.Minute))
	}
	v := c.historyOf(leasing.Inbox)
	require.Equal(t, "-", v.RateNow)
	require.Equal(t, "30.0", v.RateMax)
	require.Equal(t, int64(7), v.DepthNow)
	require.Equal(t, "since this console started, sampled every 1m0s", v.Label)
}
