//go:build !unix

package bench

import "time"

// ProcessCPU reports false: this system's process CPU time is not read
// (see cpu_unix.go).
func ProcessCPU() (time.Duration, bool) { return 0, false }
