package console

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestParseDuration(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]time.Duration{
		"90s": 90 * time.Second, "36h": 36 * time.Hour, "7d": 7 * 24 * time.Hour, "1d12h": 36 * time.Hour, "0d": 0,
	} {
		got, err := ParseDuration(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	for _, in := range []string{"", "7x", "d", "-1d", "1d-1h", "1.5d", "7days"} {
		_, err := ParseDuration(in)
		require.ErrorContains(t, err, "7d", in)
	}
}
