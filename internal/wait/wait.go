// Package wait holds the one context-aware sleep that the Listener and the
// processor share.
package wait

import (
	"context"
	"time"
)

// Sleep waits d, or until ctx ends, and reports whether d passed.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
