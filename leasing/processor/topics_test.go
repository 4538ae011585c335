package processor_test

import (
	"context"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/processor"
)

// TestTopicScopedProcessor: a processor with Topics handles only its
// topics' messages (the outbox's topics here), and leaves the others due.
func TestTopicScopedProcessor(t *testing.T) {
	t.Parallel()
	b := setupProcessor(t, leasing.Outbox)
	res, err := b.mem.Enqueue(context.Background(),
		leasing.NewMessage{Topic: "orders"}, leasing.NewMessage{Topic: "payments"},
		leasing.NewMessage{Topic: "orders"}, leasing.NewMessage{Topic: "audit"})
	require.NoError(t, err)
	var (
		mu      sync.Mutex
		handled []uuid.UUID
	)
	r := b.start(t, nil, func(_ context.Context, l leasing.Lease) error {
		mu.Lock()
		defer mu.Unlock()
		handled = append(handled, l.Message.ID)
		return nil
	}, processor.Options{Topics: []string{"orders", "audit"}, Concurrency: 1})
	for _, i := range []int{0, 2, 3} {
		waitFor(t, statusIs(b.mem, res.IDs[i], leasing.StatusPublished), "published")
	}
	require.NoError(t, r.stop(t))
	require.Equal(t, leasing.StatusPending, b.row(t, res.IDs[1]).Status, "another topic stays due")
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []uuid.UUID{res.IDs[0], res.IDs[2], res.IDs[3]}, handled, "FIFO within the topics")
}
