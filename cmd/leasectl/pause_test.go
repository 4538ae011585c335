package main

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/internal/dbtest"
)

// TestPauseCommands: pause and resume a topic and the whole queue; claim
// takes nothing paused; bad input exits 2 and changes nothing.
func TestPauseCommands(t *testing.T) {
	t.Parallel()
	url := dbtest.DatabaseURL(t)
	requireOK(t, "enqueue", "--queue", "outbox", "--topic", "orders", "--database-url", url)
	requireOK(t, "enqueue", "--queue", "outbox", "--topic", "payments", "--database-url", url)

	out := requireOK(t, "pause", "--queue", "outbox", "--topic", "orders", "--by", "ops@box", "--database-url", url)
	require.Contains(t, out, "outbox: topic orders paused by ops@box at ")
	require.Contains(t, requireOK(t, "stats", "--queue", "outbox", "--database-url", url), "  paused          topic orders by ops@box at ")
	var st map[string]struct {
		Paused []struct{ Topic, By string } `json:"paused"`
	}
	require.NoError(t, json.Unmarshal([]byte(requireOK(t, "stats", "--queue", "outbox", "--json", "--database-url", url)), &st))
	require.Len(t, st["outbox"].Paused, 1)
	require.Equal(t, "orders", st["outbox"].Paused[0].Topic)
	require.Equal(t, "ops@box", st["outbox"].Paused[0].By)
	var claimed struct {
		Leases []struct{} `json:"leases"`
	}
	require.NoError(t, json.Unmarshal([]byte(requireOK(t, "claim", "--queue", "outbox", "--owner", "o", "--batch", "10", "--json", "--database-url", url)), &claimed))
	require.Len(t, claimed.Leases, 1, "only the unpaused topic")

	for _, bad := range [][]string{
		{"pause", "--queue", "nope", "--all"},
		{"pause", "--queue", "outbox"},
		{"pause", "--queue", "outbox", "--topic", ""},
		{"pause", "--queue", "outbox", "--all", "--topic", "x"},
		{"resume", "--queue", "outbox", "--topic", "a", "--topic", "a"},
	} {
		r := leasectl(t, append(bad, "--database-url", url)...)
		require.Equal(t, 2, r.code, "%v: %s", bad, r.stderr)
	}
	var paused []struct {
		Topic, By string
	}
	require.NoError(t, json.Unmarshal([]byte(requireOK(t, "pause", "--queue", "inbox", "--all", "--by", "ops", "--json", "--database-url", url)), &paused))
	require.Len(t, paused, 1)
	require.Equal(t, "", paused[0].Topic)
	require.Contains(t, requireOK(t, "resume", "--queue", "outbox", "--topic", "orders", "--database-url", url), "outbox: nothing paused", "bad input changed nothing")
	require.NoError(t, json.Unmarshal([]byte(requireOK(t, "claim", "--queue", "outbox", "--owner", "o", "--batch", "10", "--json", "--database-url", url)), &claimed))
	require.Len(t, claimed.Leases, 1, "the resumed topic")
}
