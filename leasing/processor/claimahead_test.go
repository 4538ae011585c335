package processor_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/processor"
)

// TestProcessorClaimsAhead: with every slot busy, a processor claims its
// next batch once fewer leases wait than half a batch (or half the slots),
// and no further; with one slot it claims only when the slot is free.
func TestProcessorClaimsAhead(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name               string
		concurrency, batch int
		held               int // leases held with every handler blocked
	}{
		{"FourSlots", 4, 4, 8},   // 4 running, a batch of 4 claimed when 0 < 2 waited
		{"OneSlot", 1, 4, 4},     // 1 running, 3 waiting from the first claim
		{"EightSlots", 8, 4, 12}, // 8 running from two claims, a third waits: 4 >= 2
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setupProcessor(t, leasing.Inbox)
			b.enqueue(t, 40)
			release := make(chan struct{})
			var started atomic.Int32
			b.start(t, nil, func(ctx context.Context, _ leasing.Lease) error {
				started.Add(1)
				select {
				case <-release:
				case <-ctx.Done():
				}
				return nil
			}, processor.Options{Concurrency: tc.concurrency, BatchSize: tc.batch, ShutdownGrace: time.Second})
			defer close(release)
			leased := func() int {
				st, err := b.mem.Stats(context.Background())
				require.NoError(t, err)
				return int(st.Depth[leasing.StatusProcessing])
			}
			waitFor(t, func() bool { return int(started.Load()) == tc.concurrency && leased() == tc.held }, "claimed ahead")
			time.Sleep(50 * time.Millisecond) // ten poll intervals: no further claim
			require.Equal(t, tc.held, leased())
			require.EqualValues(t, tc.concurrency, started.Load())
		})
	}
}
