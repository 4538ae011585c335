package leasing_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/leasing"
)

func TestListenerOptions(t *testing.T) {
	t.Parallel()
	cfg, err := pgx.ParseConfig("postgres://postgres@127.0.0.1:5432/postgres")
	require.NoError(t, err)
	_, err = leasing.NewListener(cfg, leasing.Inbox, leasing.ListenerOptions{})
	require.NoError(t, err)
	for _, opts := range []leasing.ListenerOptions{
		{ProbeWait: -time.Second},
		{MinBackoff: time.Second, MaxBackoff: time.Millisecond},
	} {
		_, err = leasing.NewListener(cfg, leasing.Inbox, opts)
		var argErr *leasing.ArgumentError
		require.ErrorAs(t, err, &argErr, "%+v", opts)
	}
	_, err = leasing.NewListener(nil, leasing.Inbox, leasing.ListenerOptions{})
	require.ErrorIs(t, err, leasing.ErrInvalidArgument)
}
