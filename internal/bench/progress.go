package bench

import (
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// progress writes one status line to a terminal, rewritten in place with
// \r. A nil writer makes every method a no-op.
type progress struct {
	w  io.Writer
	mu sync.Mutex
}

func newProgress(w io.Writer) *progress { return &progress{w: w} }

// status replaces the line with a message.
func (p *progress) status(format string, args ...any) {
	if p.w == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.w, "\r\033[K"+format, args...)
}

// done ends the current line.
func (p *progress) done() {
	if p.w == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprint(p.w, "\n")
}

// drain shows a drain's count and rate five times a second until the
// returned stop function is called.
func (p *progress) drain(label string, want int64, drained *atomic.Int64) (stop func()) {
	if p.w == nil {
		return func() {}
	}
	start := time.Now()
	quit := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	show := func() {
		n := drained.Load()
		rate := float64(n) / time.Since(start).Seconds()
		p.status("%s: %d/%d messages (%.0f%%), %.0f msg/s", label, n, want, 100*float64(n)/float64(want), rate)
	}
	go func() {
		defer wg.Done()
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-quit:
				show()
				p.done()
				return
			case <-t.C:
				show()
			}
		}
	}()
	return func() { close(quit); wg.Wait() }
}

// IsTerminal reports whether f is a terminal (a character device), where
// a progress line rewritten with \r makes sense.
func IsTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
