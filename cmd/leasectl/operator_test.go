package main

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/internal/dbtest"
	"github.com/leasestore/leasestore/leasing"
)

// TestRequeue checks that only dead-lettered messages are requeued and the counts printed.
func TestRequeue(t *testing.T) {
	t.Parallel()
	url := dbtest.DatabaseURL(t)
	store := storeFor(t, url, leasing.Inbox)
	ctx := t.Context()

	res, err := store.Enqueue(ctx, leasing.NewMessage{}, leasing.NewMessage{})
	require.NoError(t, err)
	pending, dead := res.IDs[0], res.IDs[1]
	leases, err := store.Claim(ctx, leasing.ClaimRequest{Owner: "test", BatchSize: 2, LeaseFor: time.Minute})
	require.NoError(t, err)
	require.Len(t, leases, 2)
	_, err = store.Release(ctx, leases[0])
	require.NoError(t, err)
	written, err := store.DeadLetter(ctx, leasing.Failure{Lease: leases[1], Error: "boom"})
	require.NoError(t, err)
	require.NoError(t, written.Err())

	// An id left alone is a failure, as get and dead-letter of a missing
	// message are: exit 1, naming the id and why.
	r := leasectl(t, "requeue", "--queue", "inbox", "--id", pending.String(), "--database-url", url)
	require.Equal(t, 1, r.code, r.stderr)
	require.Equal(t, "requested 1, requeued 0\n", r.stdout)
	require.Contains(t, r.stderr, "inbox message "+pending.String()+" was not dead-lettered (now pending)")
	unknown := uuid.New()
	r = leasectl(t, "requeue", "--queue", "inbox", "--id", unknown.String(), "--database-url", url)
	require.Equal(t, 1, r.code, r.stderr)
	require.Contains(t, r.stderr, "inbox message "+unknown.String()+" not found")
	row, err := store.Get(ctx, pending)
	require.NoError(t, err)
	require.Equal(t, leasing.StatusPending, row.Status)

	out := requireOK(t, "requeue", "--queue", "outbox", "--all", "--database-url", url)
	require.Contains(t, out, "requested 0, requeued 0")

	type requeueOut struct {
		Queue       string      `json:"queue"`
		Requested   int         `json:"requested"`
		Requeued    int         `json:"requeued"`
		RequeuedIDs []uuid.UUID `json:"requeued_ids"`
		NotRequeued []uuid.UUID `json:"not_requeued"`
	}
	var all requeueOut
	require.NoError(t, json.Unmarshal([]byte(requireOK(t, "requeue", "--queue", "outbox", "--all", "--json", "--database-url", url)), &all))
	require.Equal(t, requeueOut{Queue: "outbox", RequeuedIDs: []uuid.UUID{}, NotRequeued: []uuid.UUID{}}, all)

	// The ids given that are dead-lettered are requeued beside those left
	// alone; the output says which were which, and the exit status 1.
	var got requeueOut
	missing := uuid.New()
	r = leasectl(t, "requeue", "--queue", "inbox", "--id", dead.String(), "--id", pending.String(), "--id", missing.String(), "--json", "--database-url", url)
	require.Equal(t, 1, r.code, r.stderr)
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &got), r.stdout)
	require.Equal(t, requeueOut{
		Queue: "inbox", Requested: 3, Requeued: 1, RequeuedIDs: []uuid.UUID{dead}, NotRequeued: []uuid.UUID{pending, missing},
	}, got, "the ids left alone are listed, in the order given")
	require.Contains(t, r.stdout, `"not_requeued"`)
	require.Contains(t, r.stderr, pending.String()+" was not dead-lettered (now pending); inbox message "+missing.String()+" not found")
	require.NotContains(t, r.stderr, dead.String())
	row, err = store.Get(ctx, dead)
	require.NoError(t, err)
	require.Equal(t, leasing.StatusPending, row.Status)
	require.Zero(t, row.AttemptCount)
	require.Empty(t, row.LastError)
}

// TestPurgeRetention: purge with a retention policy deletes finished rows
// and dead letters each past its own window, and refuses a window shorter
// than the min dedup window before connecting.
func TestPurgeRetention(t *testing.T) {
	t.Parallel()
	url := dbtest.DatabaseURL(t)
	store := storeFor(t, url, leasing.Inbox)
	ctx := t.Context()
	requireOK(t, "enqueue", "--queue", "inbox", "--count", "3", "--database-url", url)
	leases, err := store.Claim(ctx, leasing.ClaimRequest{Owner: "test", BatchSize: 3, LeaseFor: time.Minute})
	require.NoError(t, err)
	_, err = store.Complete(ctx, leases[:2]...)
	require.NoError(t, err)
	_, err = store.DeadLetter(ctx, leasing.Failure{Lease: leases[2], Error: "boom"})
	require.NoError(t, err)

	r := leasectl(t, "purge", "--queue", "inbox", "--older-than", "1m", "--min-dedup-window", "1h", "--database-url", url)
	require.Equal(t, 2, r.code, r.stderr)
	require.Contains(t, r.stderr, "shorter than the min dedup window")

	out := requireOK(t, "purge", "--queue", "inbox", "--older-than", "1us", "--dead-lettered-older-than", "1h", "--database-url", url)
	require.Contains(t, out, "purged 2 finished inbox messages older than 1µs and 0 dead-lettered")
	st := stats(t, url)["inbox"].Depth
	require.Equal(t, int64(0), st["completed"])
	require.Equal(t, int64(1), st["dead_lettered"], "the dead letter is younger than its window")
	out = requireOK(t, "purge", "--queue", "inbox", "--older-than", "1us", "--dead-lettered-older-than", "1us", "--database-url", url)
	require.Contains(t, out, "and 1 dead-lettered")
}

// TestPurge purges finished messages in batches and keeps active and (by default) dead-lettered ones.
func TestPurge(t *testing.T) {
	t.Parallel()
	url := dbtest.DatabaseURL(t)
	store := storeFor(t, url, leasing.Inbox)
	ctx := t.Context()

	requireOK(t, "enqueue", "--queue", "inbox", "--count", "26", "--database-url", url)
	leases, err := store.Claim(ctx, leasing.ClaimRequest{Owner: "test", BatchSize: 26, LeaseFor: time.Minute})
	require.NoError(t, err)
	written, err := store.Complete(ctx, leases[:25]...)
	require.NoError(t, err)
	require.NoError(t, written.Err())
	written, err = store.DeadLetter(ctx, leasing.Failure{Lease: leases[25], Error: "boom"})
	require.NoError(t, err)
	require.NoError(t, written.Err())
	requireOK(t, "enqueue", "--queue", "inbox", "--count", "2", "--database-url", url)

	out := requireOK(t, "purge", "--queue", "inbox", "--older-than", "1h", "--database-url", url)
	require.Contains(t, out, "purged 0 ")
	require.Equal(t, int64(25), stats(t, url)["inbox"].Depth["completed"])

	// 25 rows in batches of 2: 13 statements; not a terminal, so one
	// progress line after 10 batches.
	r := leasectl(t, "purge", "--queue", "inbox", "--older-than", "1us", "--batch", "2", "--database-url", url)
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "purged 25 finished inbox messages")
	require.Equal(t, "purge inbox: 20 deleted in 10 batches\n", r.stderr)
	st := stats(t, url)["inbox"].Depth
	require.Equal(t, int64(0), st["completed"])
	require.Equal(t, int64(1), st["dead_lettered"], "dead-lettered rows are kept by default")
	require.Equal(t, int64(2), st["pending"], "active rows are never purged")

	out = requireOK(t, "purge", "--queue", "inbox", "--older-than", "1us", "--include-dead-lettered", "--database-url", url)
	require.Contains(t, out, "purged 1 finished and dead-lettered inbox message older than 1µs")
	st = stats(t, url)["inbox"].Depth
	require.Equal(t, int64(0), st["dead_lettered"])
	require.Equal(t, int64(2), st["pending"])
}
