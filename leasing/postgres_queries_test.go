package leasing

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"testing"
	"unsafe"

	"github.com/leasestore/leasestore/internal/pgbatch"
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

// Each field of a queue's queries sends that queue's statement: the
// outbox's never names an inbox table, nor the inbox's an outbox table.
func TestQueriesNameTheirQueue(t *testing.T) {
	t.Parallel()
	for q, other := range map[Queue]string{Inbox: "outbox_", Outbox: "inbox_"} {
		qs := queriesFor(q)
		v := reflect.ValueOf(&qs).Elem()
		for i := range v.NumField() {
			name := v.Type().Field(i).Name
			// The fields are unexported: reach them through their address.
			f := reflect.NewAt(v.Field(i).Type(), unsafe.Pointer(v.Field(i).UnsafeAddr())).Elem()
			if q == Outbox && name == "enqueueDuplicates" {
				require.True(t, f.IsNil(), "the outbox refuses duplicates: it has no lookup")
				continue
			}
			require.False(t, f.IsNil(), "%s: %s is not set", q, name)
			var rec pgbatch.Recorder
			f.Call([]reflect.Value{reflect.ValueOf(context.Background()), reflect.ValueOf(&rec), reflect.Zero(f.Type().In(2))})
			stmt, ok := rec.First()
			if name == "enqueueCopy" {
				require.False(t, ok, "COPY is not recorded")
				continue
			}
			require.True(t, ok, "%s: %s sent no statement", q, name)
			require.Contains(t, stmt.SQL, string(q)+"_", "%s: %s", q, name)
			require.NotContains(t, stmt.SQL, other, "%s: %s", q, name)
		}
	}
}
