package main

import (
	"context"
	"encoding/json"
	neturl "net/url"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/internal/dbtest"
)

// TestOrderingCommands: enqueue --ordering-key puts messages in a key's
// line, get shows the key and the place, stats and doctor report the
// waiting messages and the head, ordering shows and sets strict mode.
func TestOrderingCommands(t *testing.T) {
	t.Parallel()
	url := dbtest.DatabaseURL(t)
	var enq struct {
		IDs []uuid.UUID `json:"ids"`
	}
	out := requireOK(t, "enqueue", "--queue", "outbox", "--count", "3", "--ordering-key", "order-7", "--json", "--database-url", url)
	require.NoError(t, json.Unmarshal([]byte(out), &enq))
	require.Len(t, enq.IDs, 3)

	out = requireOK(t, "get", "--queue", "outbox", "--id", enq.IDs[1].String(), "--database-url", url)
	require.Contains(t, out, "ordering key      order-7 (key seq 2: its place in the key's enqueue order)")
	require.Contains(t, out, "status            waiting")
	var row rowJSON
	require.NoError(t, json.Unmarshal([]byte(requireOK(t, "get", "--queue", "outbox", "--id", enq.IDs[0].String(), "--json", "--database-url", url)), &row))
	require.Equal(t, "order-7", row.OrderingKey)
	require.Equal(t, int64(1), row.KeySeq)

	st := stats(t, url)
	require.Equal(t, int64(2), st["outbox"].Depth["waiting"])
	require.Equal(t, int64(1), st["outbox"].Depth["pending"])
	require.NotNil(t, st["outbox"].OldestHead)
	require.Equal(t, "order-7", st["outbox"].OldestHead.OrderingKey)
	require.Equal(t, enq.IDs[0].String(), st["outbox"].OldestHead.MessageID)
	require.Contains(t, requireOK(t, "stats", "--queue", "outbox", "--database-url", url), `key "order-7", head `+enq.IDs[0].String())

	require.Contains(t, requireOK(t, "ordering", "--queue", "outbox", "--database-url", url), "outbox ordering: default")
	require.Contains(t, requireOK(t, "ordering", "--queue", "outbox", "--strict", "true", "--database-url", url), "outbox ordering: strict")
	require.Contains(t, requireOK(t, "ordering", "--queue", "inbox", "--database-url", url), "inbox ordering: default", "per queue")
	r := leasectl(t, "ordering", "--queue", "outbox", "--strict", "maybe", "--database-url", url)
	require.Equal(t, 2, r.code)
	require.Contains(t, requireOK(t, "ordering", "--queue", "outbox", "--database-url", url), "outbox ordering: strict", "a bad flag changes nothing")

	// A role without the operator's rights is told where they come from.
	role := dbtest.RoleName(t)
	admin, err := pgx.Connect(t.Context(), url)
	require.NoError(t, err)
	defer admin.Close(context.Background())
	_, err = admin.Exec(t.Context(), "CREATE ROLE "+pgx.Identifier{role}.Sanitize()+" LOGIN")
	require.NoError(t, err)
	t.Cleanup(func() {
		c, err := pgx.Connect(context.Background(), url)
		require.NoError(t, err)
		defer c.Close(context.Background())
		_, err = c.Exec(context.Background(), "DROP ROLE "+pgx.Identifier{role}.Sanitize())
		require.NoError(t, err)
	})
	asRole, err := neturl.Parse(url)
	require.NoError(t, err)
	asRole.User = neturl.User(role)
	r = leasectl(t, "ordering", "--queue", "outbox", "--strict", "false", "--database-url", asRole.String())
	require.Equal(t, 1, r.code, r.stderr)
	require.Contains(t, r.stderr, "permission denied")
	require.Contains(t, r.stderr, "leasestore_operator")
	require.Contains(t, requireOK(t, "ordering", "--queue", "outbox", "--database-url", url), "outbox ordering: strict")

	r = leasectl(t, "enqueue", "--queue", "outbox", "--ordering-key", "a\xffb", "--database-url", url)
	require.Equal(t, 2, r.code, r.stderr)

	// claim shows each lease's key; one message per key.
	var claimed struct {
		Leases []leaseJSON `json:"leases"`
	}
	require.NoError(t, json.Unmarshal([]byte(requireOK(t, "claim", "--queue", "outbox", "--owner", "ops", "--lease", "1h", "--json", "--database-url", url)), &claimed))
	require.Len(t, claimed.Leases, 1, "one message per key")
	require.Equal(t, "order-7", claimed.Leases[0].OrderingKey)
}
