package main

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/internal/dbtest"
	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/leasingtest"
)

// TestClaim claims with JSON and text output, with and without a tenant.
func TestClaim(t *testing.T) {
	t.Parallel()
	url := dbtest.DatabaseURL(t)
	requireOK(t, "enqueue", "--queue", "inbox", "--count", "3", "--database-url", url)
	requireOK(t, "enqueue", "--queue", "inbox", "--count", "1", "--tenant", "t2", "--database-url", url)

	var claimed struct {
		Queue        string  `json:"queue"`
		Owner        string  `json:"owner"`
		LeaseSeconds float64 `json:"lease_seconds"`
		Leases       []struct {
			MessageID  uuid.UUID `json:"message_id"`
			Owner      string    `json:"owner"`
			Generation int64     `json:"generation"`
			Attempt    int       `json:"attempt"`
			ExpiresAt  time.Time `json:"expires_at"`
			TenantID   string    `json:"tenant_id"`
		} `json:"leases"`
	}
	r := leasectl(t, "claim", "--queue", "inbox", "--owner", "ops-1", "--batch", "2", "--lease", "1m", "--json", "--database-url", url)
	require.Equal(t, 0, r.code, r.stderr)
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &claimed))
	require.Contains(t, r.stderr, "expire")
	require.Equal(t, "ops-1", claimed.Owner)
	require.Equal(t, 60.0, claimed.LeaseSeconds)
	require.Len(t, claimed.Leases, 2)
	for _, l := range claimed.Leases {
		require.Equal(t, "ops-1", l.Owner, "the owner is used as given")
		require.Equal(t, 1, l.Attempt)
		require.WithinDuration(t, time.Now().Add(time.Minute), l.ExpiresAt, 30*time.Second)
		row, err := storeFor(t, url, leasing.Inbox).Get(t.Context(), l.MessageID)
		require.NoError(t, err)
		require.Equal(t, leasing.StatusProcessing, row.Status)
		require.Equal(t, "ops-1", row.LeaseOwner)
		require.Equal(t, row.LeaseGeneration, l.Generation)
		require.Equal(t, int64(1), leasingtest.Generations(row), "claimed once")
	}

	out := requireOK(t, "claim", "--queue", "inbox", "--owner", "ops-2", "--tenant", "t2", "--database-url", url)
	require.Contains(t, out, `claimed 1 inbox message for owner "ops-2"`)
	require.Contains(t, out, "MESSAGE ID")
	require.Contains(t, out, "expire")

	out = requireOK(t, "claim", "--queue", "inbox", "--owner", "ops-2", "--tenant", "t2", "--database-url", url)
	require.Contains(t, out, "no due inbox messages")

	st := stats(t, url)
	require.Equal(t, int64(3), st["inbox"].Depth["processing"])
	require.Equal(t, int64(1), st["inbox"].Depth["pending"])
}

// TestClaimPrintsLeasesBesideParkedRows: a claim that parks a row it
// cannot lease (headers that are not a JSON object, written by hand)
// still prints the leases it took, exits 0, and names the parked row.
func TestClaimPrintsLeasesBesideParkedRows(t *testing.T) {
	t.Parallel()
	url := dbtest.DatabaseURL(t)
	requireOK(t, "enqueue", "--queue", "inbox", "--count", "3", "--database-url", url)
	store := storeFor(t, url, leasing.Inbox)
	page, err := store.List(t.Context(), leasing.ListRequest{Limit: 3})
	require.NoError(t, err)
	bad := page.Rows[0].ID
	_, err = store.Pool().Exec(t.Context(), "UPDATE inbox_messages SET headers = '[1]' WHERE message_id = $1", bad)
	require.NoError(t, err)

	r := leasectl(t, "claim", "--queue", "inbox", "--owner", "ops", "--batch", "10", "--json", "--database-url", url)
	require.Equal(t, 0, r.code, r.stderr)
	var claimed struct {
		Leases []struct {
			MessageID uuid.UUID `json:"message_id"`
		} `json:"leases"`
		Parked []struct {
			MessageID uuid.UUID `json:"message_id"`
			Reason    string    `json:"reason"`
		} `json:"parked"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &claimed))
	require.Len(t, claimed.Leases, 2)
	require.Len(t, claimed.Parked, 1)
	require.Equal(t, bad, claimed.Parked[0].MessageID)
	require.Contains(t, claimed.Parked[0].Reason, "not an object")
	require.Contains(t, r.stderr, "parked inbox message "+bad.String())
}
