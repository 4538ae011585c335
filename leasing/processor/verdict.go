package processor

import (
	"errors"
	"fmt"
	"time"
)

// Verdict is what a handler says about its failure, by wrapping the error
// it returns with Permanent, RetryAfter or Unavailable. A plain error is
// VerdictRetry.
type Verdict int

const (
	// VerdictRetry is a plain handler error: the attempt is spent and the
	// RetryPolicy decides between failed (due again after its backoff) and
	// dead_lettered.
	VerdictRetry Verdict = iota
	// VerdictPermanent dead-letters the message at once, whatever attempts
	// are left: the message itself is bad and no retry can succeed.
	VerdictPermanent
	// VerdictRetryAfter releases the message without spending the attempt;
	// it is due again after the delay the handler gave.
	VerdictRetryAfter
	// VerdictUnavailable says the destination, not the message, failed:
	// the message is released as for VerdictRetryAfter and the failure
	// counts towards opening the processor's breaker.
	VerdictUnavailable
)

// String returns the verdict's name as logs and metrics show it: "retry",
// "permanent", "retry_after" or "unavailable".
func (v Verdict) String() string {
	switch v {
	case VerdictPermanent:
		return "permanent"
	case VerdictRetryAfter:
		return "retry_after"
	case VerdictUnavailable:
		return "unavailable"
	default:
		return "retry"
	}
}

// VerdictError is the error Permanent, RetryAfter and Unavailable return:
// Err with the handler's verdict on it. errors.As finds it through further
// wrapping, and errors.Is and errors.As see Err through it.
type VerdictError struct {
	// Verdict is the handler's verdict; never VerdictRetry.
	Verdict Verdict
	// After is how long, from the store's now when the release is written,
	// the message stays invisible: set for VerdictRetryAfter; 0 for the
	// others (an unavailable destination's delay is the breaker's).
	After time.Duration
	// Err is the failure, recorded as the message's last error.
	Err error
}

// Error returns Err's text behind the verdict, e.g. "permanent: bad
// payload" or "retry after 30s: rate limited".
func (e *VerdictError) Error() string {
	msg := "<nil>"
	if e.Err != nil {
		msg = e.Err.Error()
	}
	if e.Verdict == VerdictRetryAfter {
		return fmt.Sprintf("retry after %s: %s", e.After, msg)
	}
	return e.Verdict.String() + ": " + msg
}

// Unwrap returns Err.
func (e *VerdictError) Unwrap() error { return e.Err }

// Permanent marks err as a failure no retry can fix (a poison message): the
// Processor dead-letters the message now with err as its last error. It
// returns nil for a nil err.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &VerdictError{Verdict: VerdictPermanent, Err: err}
}

// RetryAfter marks err as a failure to retry after d without spending an
// attempt (the destination asked to slow down, say): the Processor releases
// the message, due again d after the database's now, with err as its last
// error. d is clamped to 0..RetryPolicy.MaxDelay. It returns nil for a nil
// err.
func RetryAfter(d time.Duration, err error) error {
	if err == nil {
		return nil
	}
	return &VerdictError{Verdict: VerdictRetryAfter, After: max(d, 0), Err: err}
}

// Unavailable marks err as the destination's failure rather than the
// message's (connection refused, timeout, no responders): the Processor
// releases the message without spending an attempt, as RetryAfter does, and
// counts the failure towards opening its breaker for the message's topic
// (outbox) or type (inbox). It returns nil for a nil err.
func Unavailable(err error) error {
	if err == nil {
		return nil
	}
	return &VerdictError{Verdict: VerdictUnavailable, Err: err}
}

// VerdictOf returns the verdict err carries and, for VerdictRetryAfter, its
// delay: the outermost *VerdictError errors.As finds, else VerdictRetry.
func VerdictOf(err error) (Verdict, time.Duration) {
	var ve *VerdictError
	if errors.As(err, &ve) {
		return ve.Verdict, ve.After
	}
	return VerdictRetry, 0
}
