package leasing_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/leasing"
)

func TestQueueChannel(t *testing.T) {
	t.Parallel()
	require.Equal(t, "inbox_messages", leasing.Inbox.Channel())
	require.Equal(t, "outbox_messages", leasing.Outbox.Channel())
}
