package leasing

import (
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
)

func TestIDTexts(t *testing.T) {
	t.Parallel()
	ids := []uuid.UUID{uuid.New(), uuid.Nil, uuid.Max, uuid.MustParse("0191f7d2-7b4e-7c3a-9d1e-2f3a4b5c6d7e")}
	want := make([]string, len(ids))
	for i, id := range ids {
		want[i] = id.String()
	}
	require.Equal(t, want, idTexts(ids))
	require.Equal(t, []string{}, idTexts(nil), "never nil: an empty array, not NULL")
}
