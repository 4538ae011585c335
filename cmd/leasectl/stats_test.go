package main

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/internal/dbtest"
	"github.com/leasestore/leasestore/leasing"
)

// TestEnqueueStats enqueues on both queues (one batch and more than one) and reads stats as JSON and text.
func TestEnqueueStats(t *testing.T) {
	t.Parallel()
	url := dbtest.DatabaseURL(t)

	var enq struct {
		Queue    string      `json:"queue"`
		Enqueued int         `json:"enqueued"`
		IDs      []uuid.UUID `json:"ids"`
	}
	out := requireOK(t, "enqueue", "--queue", "inbox", "--count", "3", "--tenant", "t1",
		"--type", "order.placed", "--payload", `{"n":1}`, "--json", "--database-url", url)
	require.NoError(t, json.Unmarshal([]byte(out), &enq))
	require.Equal(t, "inbox", enq.Queue)
	require.Equal(t, 3, enq.Enqueued)
	require.Len(t, enq.IDs, 3)
	row, err := storeFor(t, url, leasing.Inbox).Get(t.Context(), enq.IDs[0])
	require.NoError(t, err)
	require.Equal(t, "t1", row.TenantID)
	require.Equal(t, "order.placed", row.Type)
	require.Equal(t, `{"n":1}`, string(row.Payload))
	out = requireOK(t, "enqueue", "--queue", "inbox", "--database-url", url)
	require.Equal(t, "enqueued 1 inbox message (due now)\n", out)

	// More than one batch: leasing.MaxBatchSize + 1 messages, delayed.
	out = requireOK(t, "enqueue", "--queue", "outbox", "--count", fmt.Sprint(leasing.MaxBatchSize+1),
		"--delay", "1h", "--topic", "orders", "--database-url", url)
	require.Contains(t, out, fmt.Sprintf("enqueued %d outbox messages (due in 1h0m0s)", leasing.MaxBatchSize+1))

	st := stats(t, url)
	require.Equal(t, map[string]int64{
		"pending": 4, "processing": 0, "completed": 0, "failed": 0, "dead_lettered": 0, "waiting": 0,
	}, st["inbox"].Depth)
	require.Equal(t, map[string]int64{
		"pending": int64(leasing.MaxBatchSize + 1), "publishing": 0, "published": 0, "failed": 0, "dead_lettered": 0, "waiting": 0,
	}, st["outbox"].Depth)
	require.Zero(t, st["outbox"].OldestDueAgeSeconds, "delayed rows are not due")
	require.Zero(t, st["inbox"].ExpiredLeases)

	var only statsOut
	require.NoError(t, json.Unmarshal([]byte(requireOK(t, "stats", "--json", "--queue", "inbox", "--database-url", url)), &only))
	require.Len(t, only, 1)
	require.Contains(t, only, "inbox")

	text := requireOK(t, "stats", "--database-url", url)
	require.Regexp(t, `(?m)^inbox$`, text)
	require.Regexp(t, `(?m)^  pending +4$`, text)
	require.Regexp(t, `(?m)^  dead_lettered +0$`, text)
	require.Contains(t, text, "expired leases")
	require.Contains(t, text, "oldest due age")
}
