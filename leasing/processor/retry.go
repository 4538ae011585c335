package processor

import (
	"math"
	"math/rand/v2"
	"time"

	"github.com/leasestore/leasestore/leasing"
)

// RetryPolicy decides what a Processor writes after a handler error: failed
// with a retry delay, or dead_lettered once the attempts are spent. The zero
// value is the default policy; a zero field takes its default.
type RetryPolicy struct {
	// MaxAttempts is the number of attempts a message gets, 1..math.MaxInt32:
	// a handler error on attempt MaxAttempts (or later) dead-letters the
	// message. Defaults to 24: with the default delays, the retries of a
	// plain error span 78 minutes (4,711 s) before the last attempt, so a
	// destination down for an hour dead-letters nothing. Verdicts spend no
	// attempt (RetryAfter, Unavailable) or dead-letter at once (Permanent).
	MaxAttempts int
	// InitialDelay is the retry delay after the first attempt fails,
	// 0..MaxDelay. Defaults to 1 second.
	InitialDelay time.Duration
	// MaxDelay caps every retry delay, InitialDelay..leasing.MaxDelay.
	// Defaults to 5 minutes (raised to InitialDelay when that is longer).
	MaxDelay time.Duration
	// Multiplier is the growth factor between consecutive delays, >= 1;
	// 1 gives a fixed delay. Defaults to 2.
	Multiplier float64
	// Jitter is the fraction, 0..1, by which each delay is shortened at
	// random: a delay d becomes a uniform value in [(1-Jitter)·d, d]. 0
	// (the default) gives exact delays.
	Jitter float64
}

// Default retry policy values: 23 retries 1, 2, 4, ... 256 s, then 14 of
// 5 minutes, 4,711 s in all before the 24th and last attempt.
const (
	DefaultMaxAttempts  = 24
	DefaultInitialDelay = time.Second
	DefaultMaxDelay     = 5 * time.Minute
	DefaultMultiplier   = 2.0
)

// withDefaults returns p with zero fields set to their defaults.
func (p RetryPolicy) withDefaults() RetryPolicy {
	if p.MaxAttempts == 0 {
		p.MaxAttempts = DefaultMaxAttempts
	}
	if p.InitialDelay == 0 {
		p.InitialDelay = DefaultInitialDelay
	}
	if p.MaxDelay == 0 {
		p.MaxDelay = max(DefaultMaxDelay, p.InitialDelay)
	}
	if p.Multiplier == 0 {
		p.Multiplier = DefaultMultiplier
	}
	return p
}

// validate checks a policy after withDefaults; its delays by the rule of
// every retry delay (leasing.ValidateDelay).
func (p RetryPolicy) validate() error {
	if p.MaxAttempts < 1 || p.MaxAttempts > math.MaxInt32 {
		return argumentError("retry max attempts", "must be 1..%d, got %d", math.MaxInt32, p.MaxAttempts)
	}
	if err := leasing.ValidateDelay("retry initial delay", p.InitialDelay); err != nil {
		return err
	}
	if p.MaxDelay < p.InitialDelay {
		return argumentError("retry max delay", "must be at least the initial delay %s, got %s", p.InitialDelay, p.MaxDelay)
	}
	if err := leasing.ValidateDelay("retry max delay", p.MaxDelay); err != nil {
		return err
	}
	switch {
	case !(p.Multiplier >= 1) || math.IsInf(p.Multiplier, 0):
		return argumentError("retry multiplier", "must be a finite number >= 1, got %v", p.Multiplier)
	case !(p.Jitter >= 0 && p.Jitter <= 1):
		return argumentError("retry jitter", "must be 0..1, got %v", p.Jitter)
	}
	return nil
}

// Backoff returns the retry delay after attempt (1 for the first delivery)
// failed: min(MaxDelay, InitialDelay·Multiplier^(attempt-1)), shortened at
// random by up to Jitter of itself. Zero fields take their defaults; an
// attempt below 1 counts as 1. The delay is counted on the store's clock
// from the moment the failure is written (leasing.Failure.RetryAfter).
func (p RetryPolicy) Backoff(attempt int) time.Duration {
	p = p.withDefaults()
	return p.backoff(attempt, rand.Float64())
}

// backoff is Backoff with the random draw u in [0, 1) given.
func (p RetryPolicy) backoff(attempt int, u float64) time.Duration {
	attempt = max(attempt, 1)
	d := float64(p.InitialDelay) * math.Pow(p.Multiplier, float64(attempt-1))
	if math.IsNaN(d) || d > float64(p.MaxDelay) {
		d = float64(p.MaxDelay)
	}
	d -= d * p.Jitter * u
	return time.Duration(d)
}

// DeadLetters reports whether a handler error on attempt dead-letters the
// message instead of failing it for a retry: attempt >= MaxAttempts (zero
// MaxAttempts meaning the default).
func (p RetryPolicy) DeadLetters(attempt int) bool {
	return attempt >= p.withDefaults().MaxAttempts
}
