package leasing_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/internal/dbtest"
	"github.com/leasestore/leasestore/leasing"
)

// BenchmarkEnqueueDuplicates measures an inbox Enqueue of batches of 10
// keyed messages: all new (the INSERT alone, as before duplicates named
// their stored messages), and all duplicates of stored messages (the
// INSERT, then the lookup of the stored ids: a second round trip). ns/op
// is one call.
func BenchmarkEnqueueDuplicates(b *testing.B) {
	for _, dup := range []bool{false, true} {
		b.Run(map[bool]string{false: "new", true: "duplicates"}[dup], func(b *testing.B) {
			store, err := leasing.NewPostgres(benchPoolAt(b, dbtest.DatabaseURL(b)), leasing.Inbox, leasing.PostgresOptions{})
			require.NoError(b, err)
			batch := func(n int) []leasing.NewMessage {
				msgs := make([]leasing.NewMessage, 10)
				for i := range msgs {
					msgs[i] = leasing.NewMessage{Type: "bench", Payload: []byte("{}"), IdempotencyKey: fmt.Sprintf("k-%d-%d", n, i)}
				}
				return msgs
			}
			if dup {
				_, err := store.Enqueue(b.Context(), batch(0)...)
				require.NoError(b, err)
			}
			b.ResetTimer()
			for n := 0; b.Loop(); n++ {
				k := n + 1
				if dup {
					k = 0
				}
				res, err := store.Enqueue(b.Context(), batch(k)...)
				if err != nil {
					b.Fatal(err)
				}
				if dup != (len(res.Duplicates) == 10) {
					b.Fatalf("%d duplicates", len(res.Duplicates))
				}
			}
		})
	}
}
