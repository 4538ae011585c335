package processor

import "github.com/leasestore/leasestore/leasing"

// WorkSignal wakes a Processor before its poll interval ends: a
// *leasing.Listener on the queue's NOTIFY channel, or a WakeChan.
type WorkSignal interface {
	// Wake returns the channel whose receives wake the processor: Run
	// calls it once, then receives from the channel until it returns.
	//
	// Errors: none; a signal reports its own failures elsewhere
	// (leasing.Listener.Run). A channel that stops delivering, or a nil
	// one, leaves the processor claiming every Options.PollInterval; a
	// closed one wakes it once and is then ignored.
	Wake() <-chan struct{}
}

// WakeChan adapts a channel to WorkSignal: each receive wakes the processor.
type WakeChan <-chan struct{}

// Wake returns c.
func (c WakeChan) Wake() <-chan struct{} { return c }

var _ WorkSignal = (*leasing.Listener)(nil)
