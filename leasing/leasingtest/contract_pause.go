package leasingtest

import (
	"context"
	"testing"

	"github.com/google/uuid"
	"github.com/leasestore/leasestore/leasing"
	"github.com/stretchr/testify/require"
)

// pauser is what Postgres and Memory offer beside Store to pause claims;
// the cases skip a store without it.
type pauser interface {
	Pause(ctx context.Context, r leasing.PauseRequest) error
	Resume(ctx context.Context, r leasing.PauseRequest) error
	Paused(ctx context.Context) ([]leasing.Pause, error)
}

var (
	_ pauser = (*leasing.Postgres)(nil)
	_ pauser = (*leasing.Memory)(nil)
)

func (b *bundle) pauser() pauser {
	b.t.Helper()
	p, ok := b.store.(pauser)
	if !ok {
		b.t.Skip("the store cannot pause")
	}
	return p
}

// pauseCases are the cases of Pause, Resume and Paused.
var pauseCases = []contractCase{
	{"Pause/TopicStopsItsClaims", func(t *testing.T, b *bundle) {
		p := b.pauser()
		ids := b.enqueueTopics("a", "b", "a", "", "c")
		require.NoError(t, p.Pause(b.ctx, leasing.PauseRequest{Topics: []string{"a"}, By: "ops@host"}))
		got, err := p.Paused(b.ctx)
		require.NoError(t, err)
		require.Len(t, got, 1)
		require.Equal(t, b.q, got[0].Queue)
		require.Equal(t, "a", got[0].Topic)
		require.Equal(t, "ops@host", got[0].By)
		require.True(t, b.env.Clock.Now().Equal(got[0].At), "paused at %s", got[0].At)

		require.Empty(t, b.claimScoped(leasing.ClaimRequest{Topics: []string{"a"}}, 10))
		require.Equal(t, []uuid.UUID{ids[1]}, idsOf(b.claimScoped(leasing.ClaimRequest{Topics: []string{"b", "a"}}, 10)))
		require.Equal(t, []uuid.UUID{ids[3], ids[4]}, idsOf(b.claim("w", 10)), "an unscoped claim passes the paused topic")

		require.NoError(t, p.Resume(b.ctx, leasing.PauseRequest{Topics: []string{"a"}}))
		got, err = p.Paused(b.ctx)
		require.NoError(t, err)
		require.Empty(t, got)
		require.Equal(t, []uuid.UUID{ids[0], ids[2]}, idsOf(b.claim("w", 10)))
	}},
	{"Pause/WholeQueueClaimsNothing", func(t *testing.T, b *bundle) {
		p := b.pauser()
		ids := b.enqueueTopics("a", "")
		held := b.claim("w", 1)
		require.Equal(t, ids[:1], idsOf(held))
		require.NoError(t, p.Pause(b.ctx, leasing.PauseRequest{WholeQueue: true, By: "ops"}))
		require.Empty(t, b.claim("w", 10))
		require.Empty(t, b.claimScoped(leasing.ClaimRequest{Topics: []string{"a"}}, 10))
		b.env.Clock.Advance(lease)
		require.Empty(t, b.claim("w", 10), "no reclaim of an expired lease while paused")
		// Pausing a topic too, then resuming the queue: the topic stays paused.
		require.NoError(t, p.Pause(b.ctx, leasing.PauseRequest{Topics: []string{"a"}, By: "ops"}))
		require.NoError(t, p.Resume(b.ctx, leasing.PauseRequest{WholeQueue: true}))
		require.Equal(t, ids[1:], idsOf(b.claim("w", 10)))
		require.NoError(t, p.Resume(b.ctx, leasing.PauseRequest{Topics: []string{"a"}}))
		got := b.claim("w", 10)
		require.Equal(t, ids[:1], idsOf(got))
		require.Equal(t, 2, got[0].Attempt)
	}},
	{"Pause/HeldLeasesFinish", func(t *testing.T, b *bundle) {
		p := b.pauser()
		b.enqueueTopics("a")
		held := b.claim("w", 1)
		require.NoError(t, p.Pause(b.ctx, leasing.PauseRequest{Topics: []string{"a"}, By: "ops"}))
		res, err := b.store.Complete(b.ctx, held...)
		require.NoError(t, err)
		require.Equal(t, []leasing.Outcome{leasing.OutcomeApplied}, outcomes(res))
	}},
	{"Pause/AgainKeepsTheFirst", func(t *testing.T, b *bundle) {
		p := b.pauser()
		require.NoError(t, p.Pause(b.ctx, leasing.PauseRequest{Topics: []string{"a"}, By: "first"}))
		b.env.Clock.Advance(lease)
		require.NoError(t, p.Pause(b.ctx, leasing.PauseRequest{Topics: []string{"a", "b"}, By: "second"}))
		require.NoError(t, p.Resume(b.ctx, leasing.PauseRequest{Topics: []string{"never-paused"}}))
		got, err := p.Paused(b.ctx)
		require.NoError(t, err)
		require.Len(t, got, 2)
		require.Equal(t, []string{"a", "b"}, []string{got[0].Topic, got[1].Topic})
		require.Equal(t, []string{"first", "second"}, []string{got[0].By, got[1].By})
	}},
	{"Pause/BadInputChangesNothing", func(t *testing.T, b *bundle) {
		p := b.pauser()
		for name, r := range map[string]leasing.PauseRequest{
			"nothing named":    {By: "ops"},
			"empty topic":      {Topics: []string{"a", ""}, By: "ops"},
			"duplicate topic":  {Topics: []string{"a", "a"}, By: "ops"},
			"queue and topics": {WholeQueue: true, Topics: []string{"a"}, By: "ops"},
			"no one pauses":    {Topics: []string{"a"}},
			"NUL in topic":     {Topics: []string{"a\x00"}, By: "ops"},
			"invalid UTF-8 by": {WholeQueue: true, By: "\xff"},
		} {
			err := p.Pause(b.ctx, r)
			require.ErrorIs(t, err, leasing.ErrInvalidArgument, name)
			var argErr *leasing.ArgumentError
			require.ErrorAs(t, err, &argErr, name)
		}
		require.ErrorIs(t, p.Resume(b.ctx, leasing.PauseRequest{Topics: []string{""}}), leasing.ErrInvalidArgument)
		got, err := p.Paused(b.ctx)
		require.NoError(t, err)
		require.Empty(t, got)
	}},
}
