package leasing

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

// The rendered SQL (db/render's attemptHistoryLimit) keeps the attempt
// history that AttemptHistoryLimit describes.
func TestAttemptHistoryLimitMatchesSQL(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("../db/queries/*_*.sql")
	require.NoError(t, err)
	keep := regexp.MustCompile(`jsonb_array_length\(\w+\.attempts\) < (\d+)`)
	seen := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		for _, m := range keep.FindAllSubmatch(b, -1) {
			n, err := strconv.Atoi(string(m[1]))
			require.NoError(t, err)
			require.Equal(t, AttemptHistoryLimit, n, "%s keeps %d attempts", f, n)
			seen++
		}
	}
	require.NotZero(t, seen, "no attempt history bound found in db/queries")
}
