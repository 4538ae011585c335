package leasingtest

import (
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/leasestore/leasestore/leasing"
	"github.com/stretchr/testify/require"
)

// renewCases are the Renew cases.
var renewCases = []contractCase{
	{"Renew/ExtendsLease", func(t *testing.T, b *bundle) {
		id := b.enqueueN(1)[0]
		l := b.claim("a", 1)[0]
		b.env.Clock.Advance(20 * time.Second)
		res, err := b.store.Renew(b.ctx, lease, l)
		require.NoError(t, err)
		require.NoError(t, res.Err())
		require.Len(t, res.Renewed, 1)
		want := b.env.Clock.Now().Add(lease)
		require.True(t, want.Equal(res.Renewed[0].ExpiresAt))
		require.True(t, want.Equal(*b.get(id).LeaseExpiresAt))
		b.env.Clock.Advance(lease - time.Microsecond)
		require.Empty(t, b.claim("b", 1), "a renewed lease must not be reclaimed")
	}},
	{"Renew/ExpiredLeaseIsLost", func(t *testing.T, b *bundle) {
		b.enqueueN(1)
		l := b.claim("a", 1)[0]
		b.env.Clock.Advance(lease)
		res, err := b.store.Renew(b.ctx, lease, l)
		require.NoError(t, err)
		require.Equal(t, []uuid.UUID{l.Message.ID}, res.Lost)
		require.ErrorIs(t, res.Err(), leasing.ErrLeaseLost)
	}},
	{"Renew/BatchReportsLostOnes", func(t *testing.T, b *bundle) {
		b.enqueueN(3)
		ls := b.claim("a", 3)
		_, err := b.store.Complete(b.ctx, ls[1])
		require.NoError(t, err)
		res, err := b.store.Renew(b.ctx, lease, ls...)
		require.NoError(t, err)
		require.Equal(t, []uuid.UUID{ls[0].Message.ID, ls[2].Message.ID}, idsOf(res.Renewed))
		require.Equal(t, []uuid.UUID{ls[1].Message.ID}, res.Lost)
	}},
}
