package leasing_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/leasingtest"
)

// TestMemoryClaimParksUnclaimableRows: Memory parks the rows it can hold
// that the claim statement parks (integration TestClaimParksUnclaimableRows),
// with the same last_error texts: counters at the limit of their column
// types and headers that are not a JSON object. The others are claimed.
func TestMemoryClaimParksUnclaimableRows(t *testing.T) {
	t.Parallel()
	for _, q := range []leasing.Queue{leasing.Inbox, leasing.Outbox} {
		t.Run(string(q), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			clock := leasingtest.NewClock(leasingtest.Start)
			store, err := leasing.NewMemory(q, leasing.MemoryOptions{Now: clock.Now})
			require.NoError(t, err)
			now := clock.Now()
			row := func(i int, edit func(*leasing.Row)) leasing.Row {
				at := now.Add(time.Duration(i-10) * time.Second)
				r := leasing.Row{
					Message: leasing.Message{ID: uuid.New(), Headers: json.RawMessage(`{}`), CreatedAt: at, VisibleAfter: at},
					Status:  leasing.StatusPending,
				}
				edit(&r)
				return r
			}
			keep := func(*leasing.Row) {}
			rows := []leasing.Row{
				row(0, func(r *leasing.Row) { r.AttemptCount = math.MaxInt32 }),
				row(1, keep),
				row(2, func(r *leasing.Row) { r.LeaseGeneration, r.LastWriteGeneration = math.MaxInt64, 7 }),
				row(3, func(r *leasing.Row) { r.Headers = json.RawMessage(`[1]`) }),
				row(4, func(r *leasing.Row) { r.Headers = json.RawMessage(`{"a":1}`) }), // an object: claimable
				row(5, func(r *leasing.Row) { r.Headers = json.RawMessage(`null`) }),
				row(6, keep),
			}
			require.NoError(t, store.Load(rows...))
			want := map[uuid.UUID]string{
				rows[0].ID: "parked by the claim: attempt_count is at its limit (2147483647)",
				rows[2].ID: "parked by the claim: lease_generation is at its limit (9223372036854775807)",
				rows[3].ID: "parked by the claim: headers are a JSON array, not an object",
				rows[5].ID: "parked by the claim: headers are a JSON null, not an object",
			}

			req := leasing.ClaimRequest{Owner: "w", BatchSize: 3, LeaseFor: time.Minute}
			leases, err := store.Claim(ctx, req)
			var pe *leasing.ParkedError
			require.ErrorAs(t, err, &pe)
			require.ErrorIs(t, err, leasing.ErrParked)
			require.Equal(t, q, pe.Queue)
			require.ElementsMatch(t, []leasing.ParkedRow{{ID: rows[0].ID, Reason: want[rows[0].ID]}, {ID: rows[2].ID, Reason: want[rows[2].ID]}}, pe.Parked)
			require.True(t, slices.IsSortedFunc(pe.Parked, func(a, b leasing.ParkedRow) int { return bytes.Compare(a.ID[:], b.ID[:]) }), "ordered by id")
			require.Equal(t, []uuid.UUID{rows[1].ID}, ids(leases), "the parked rows took batch slots")

			_, leases, err = store.CompleteAndClaim(ctx, leases, leasing.ClaimRequest{Owner: "w", BatchSize: 10, LeaseFor: time.Minute})
			require.ErrorAs(t, err, &pe, "CompleteAndClaim reports parked rows as Claim does")
			require.ElementsMatch(t, []leasing.ParkedRow{{ID: rows[3].ID, Reason: want[rows[3].ID]}, {ID: rows[5].ID, Reason: want[rows[5].ID]}}, pe.Parked)
			require.Equal(t, []uuid.UUID{rows[4].ID, rows[6].ID}, ids(leases))
			require.JSONEq(t, `{"a":1}`, string(leases[0].Message.Headers))

			leases, err = store.Claim(ctx, req)
			require.NoError(t, err, "nothing is left at the head")
			require.Empty(t, leases)

			for id, reason := range want {
				r, err := store.Get(ctx, id)
				require.NoError(t, err)
				require.Equal(t, leasing.StatusDeadLettered, r.Status, id)
				require.Equal(t, reason, r.LastError)
				require.NotNil(t, r.DeadLetteredAt)
				require.Nil(t, r.LeaseExpiresAt)
			}
			r, err := store.Get(ctx, rows[2].ID)
			require.NoError(t, err)
			require.Equal(t, int64(math.MaxInt64), r.LeaseGeneration, "parking leaves the counters alone")

			// Requeue resets the attempts: the row at the attempt limit is
			// claimable again.
			_, err = store.Requeue(ctx, rows[0].ID)
			require.NoError(t, err)
			leases, err = store.Claim(ctx, req)
			require.NoError(t, err)
			require.Equal(t, []uuid.UUID{rows[0].ID}, ids(leases))
			require.Equal(t, 1, leases[0].Attempt)
		})
	}
}

func TestParkedErrorText(t *testing.T) {
	t.Parallel()
	id := uuid.MustParse("01900000-0000-7000-8000-000000000001")
	err := error(&leasing.ParkedError{Queue: leasing.Inbox, Parked: []leasing.ParkedRow{{ID: id, Reason: "parked by the claim: x"}}})
	require.Equal(t, "leasing: claim inbox parked 1 message as dead_lettered; first "+id.String()+": parked by the claim: x", err.Error())
	require.True(t, errors.Is(err, leasing.ErrParked))
	require.False(t, errors.Is(err, leasing.ErrInvalidArgument))
}

func ids(leases []leasing.Lease) []uuid.UUID {
	out := make([]uuid.UUID, len(leases))
	for i, l := range leases {
		out[i] = l.Message.ID
	}
	return out
}
