package plural

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestCount(t *testing.T) {
	t.Parallel()
	require.Equal(t, "0 messages", Count(0, "message", "messages"))
	require.Equal(t, "1 message", Count(1, "message", "messages"))
	require.Equal(t, "2 batches", Count(int64(2), "batch", "batches"))
}
