// Package plural writes counts of things in the output of leasectl and the
// tools it runs, so that one of a thing is never "1 messages".
package plural

import "fmt"

// Count returns n and the noun that goes with it: one when n is 1, else
// many. "1 message", "0 messages", "2 batches".
func Count[T ~int | ~int64](n T, one, many string) string {
	if n == 1 {
		return fmt.Sprintf("%d %s", n, one)
	}
	return fmt.Sprintf("%d %s", n, many)
}
