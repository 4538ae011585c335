package processor

import (
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/leasestore/leasestore/leasing"
)

// BreakerPolicy configures a Processor's breaker, which stops claiming the
// messages of a destination that handlers report unavailable (Unavailable)
// and probes it until it answers. The zero value is on, with the defaults;
// a zero field takes its default.
type BreakerPolicy struct {
	// Threshold is the number of consecutive Unavailable verdicts, with no
	// success in between, that open the breaker, >= 1. Defaults to 5.
	Threshold int
	// ProbeInterval is the wait from opening to the first probe, and the
	// first step of the probes' backoff, > 0. Defaults to 1 second.
	ProbeInterval time.Duration
	// MaxProbeInterval caps the wait between two probes, which doubles
	// after each probe that finds the destination still unavailable,
	// >= ProbeInterval. Defaults to 30 seconds (raised to ProbeInterval).
	MaxProbeInterval time.Duration
	// Disabled turns the breaker off: Unavailable verdicts still release
	// their messages without spending an attempt, with the RetryPolicy's
	// backoff as the delay, but nothing stops the claims.
	Disabled bool
}

// Default breaker policy values.
const (
	DefaultBreakerThreshold        = 5
	DefaultBreakerProbeInterval    = time.Second
	DefaultBreakerMaxProbeInterval = 30 * time.Second
)

// resolve returns p with defaults filled in.
//
// Errors: a *leasing.ArgumentError naming the first bad field.
func (p BreakerPolicy) resolve() (BreakerPolicy, error) {
	if p.Threshold == 0 {
		p.Threshold = DefaultBreakerThreshold
	}
	if p.ProbeInterval == 0 {
		p.ProbeInterval = DefaultBreakerProbeInterval
	}
	if p.MaxProbeInterval == 0 {
		p.MaxProbeInterval = max(DefaultBreakerMaxProbeInterval, p.ProbeInterval)
	}
	switch {
	case p.Threshold < 1:
		return p, argumentError("breaker threshold", "must be >= 1, got %d", p.Threshold)
	case p.ProbeInterval < 0:
		return p, argumentError("breaker probe interval", "must be > 0, got %s", p.ProbeInterval)
	case p.MaxProbeInterval < p.ProbeInterval:
		return p, argumentError("breaker max probe interval", "must be at least the probe interval %s, got %s",
			p.ProbeInterval, p.MaxProbeInterval)
	}
	return p, nil
}

// BreakerState is the state of one of a processor's breakers, as the
// breaker_state gauge reports it.
type BreakerState int

const (
	// BreakerClosed claims as usual.
	BreakerClosed BreakerState = iota
	// BreakerOpen claims nothing of its topic but one probe message per
	// probe interval (nothing at all but the probe, for a topic a claim
	// cannot name: the empty topic).
	BreakerOpen
)

// String returns "closed" or "open".
func (s BreakerState) String() string {
	if s == BreakerOpen {
		return "open"
	}
	return "closed"
}

// breaker holds a processor's circuits, one per topic (outbox Topic, inbox
// Type). Workers report verdicts to it; the loop asks it what to claim: an
// open topic is left out of the claims (leasing.ClaimRequest.ExceptTopics)
// but for one probe message per interval. A topic a claim cannot name (the
// empty topic), or more open topics than a claim can leave out, block
// every claim but the probes while open. Its clock is the processor's
// monotonic one.
type breaker struct {
	policy BreakerPolicy
	retry  RetryPolicy
	queue  leasing.Queue
	ev     *events
	wake   func() // tells the loop that a circuit opened

	opened atomic.Int64 // times a circuit opened, for the loop's cheap check

	mu       sync.Mutex
	circuits map[string]*circuit // only topics that reported Unavailable since their last success
}

// errBreakerOpen is the cause of the context of a waiting lease released
// because its topic's breaker opened.
var errBreakerOpen = errors.New("processor: breaker open")

// openings returns how many times a circuit opened.
func (b *breaker) openings() int64 { return b.opened.Load() }

// circuit is the state of one topic's breaker.
type circuit struct {
	unavailable int          // consecutive Unavailable verdicts
	state       BreakerState //
	interval    time.Duration
	probeAt     time.Time // open: when the next probe may be claimed
	probing     bool      // open: a probe was claimed since the last probe result
}

func newBreaker(policy BreakerPolicy, retry RetryPolicy, q leasing.Queue, ev *events) *breaker {
	return &breaker{policy: policy, retry: retry, queue: q, ev: ev, circuits: map[string]*circuit{}}
}

// topic returns the circuit key of m: its topic (outbox) or type (inbox),
// as leasing.ClaimRequest.Topics names them.
func (b *breaker) topic(m leasing.Message) string {
	if b.queue == leasing.Outbox {
		return m.Topic
	}
	return m.Type
}

// nameable reports whether a claim can name topic in Topics or
// ExceptTopics (leasing.ClaimRequest.Validate).
func nameable(topic string) bool {
	return topic != "" && len(topic) <= leasing.MaxTopicBytes && utf8.ValidString(topic) && !strings.ContainsRune(topic, 0)
}

// unavailable records an Unavailable verdict on m at now and returns the
// delay its release gets: the RetryPolicy's backoff for the count of
// consecutive Unavailable verdicts while the circuit is closed, the probe
// interval once it is open.
func (b *breaker) unavailable(m leasing.Message, now time.Time) time.Duration {
	topic := b.topic(m)
	b.mu.Lock()
	c := b.circuits[topic]
	if c == nil {
		c = &circuit{}
		b.circuits[topic] = c
	}
	c.unavailable++
	var opened bool
	switch {
	case b.policy.Disabled:
	case c.state == BreakerClosed && c.unavailable >= b.policy.Threshold:
		c.state, c.interval, c.probeAt, opened = BreakerOpen, b.policy.ProbeInterval, now.Add(b.policy.ProbeInterval), true
		b.opened.Add(1)
	case c.state == BreakerOpen && c.probing: // the probe found it still down
		c.interval = min(2*c.interval, b.policy.MaxProbeInterval)
		c.probeAt, c.probing = now.Add(c.interval), false
	}
	delay := b.retry.Backoff(c.unavailable)
	if c.state == BreakerOpen {
		delay = min(c.interval, b.retry.MaxDelay)
	}
	n := c.unavailable
	b.mu.Unlock()
	if opened {
		b.ev.breakerChanged(topic, BreakerOpen, n)
		if b.wake != nil {
			b.wake()
		}
	}
	return delay
}

// succeeded records a success on m: its circuit closes and forgets its
// count.
func (b *breaker) succeeded(m leasing.Message) {
	topic := b.topic(m)
	b.mu.Lock()
	c := b.circuits[topic]
	if c == nil {
		b.mu.Unlock()
		return
	}
	delete(b.circuits, topic)
	b.mu.Unlock()
	if c.state == BreakerOpen {
		b.ev.breakerChanged(topic, BreakerClosed, 0)
	}
}

// failed records a handler error other than Unavailable on m: an open
// circuit's probe ended without an answer on the destination, so the next
// probe comes one interval later.
func (b *breaker) failed(m leasing.Message, now time.Time) {
	topic := b.topic(m)
	b.mu.Lock()
	defer b.mu.Unlock()
	if c := b.circuits[topic]; c != nil && c.state == BreakerOpen && c.probing {
		c.probeAt, c.probing = now.Add(c.interval), false
	}
}

// claimPlan is what the loop claims next.
type claimPlan struct {
	// blocked: claim nothing but probes (an open topic a claim cannot
	// name, or more open topics than a claim can leave out).
	blocked bool
	// except are the open topics the claim leaves out.
	except []string
	// probes are the topics of which to claim one message now.
	probes []string
	// nextProbe is the earliest probe not yet due; zero for none.
	nextProbe time.Time
}

// plan returns what to claim at now, and counts the probes it returns as
// claimed.
func (b *breaker) plan(now time.Time) claimPlan {
	var p claimPlan
	b.mu.Lock()
	defer b.mu.Unlock()
	for topic, c := range b.circuits {
		if c.state != BreakerOpen {
			continue
		}
		if nameable(topic) {
			p.except = append(p.except, topic)
		} else {
			p.blocked = true
		}
		if now.Before(c.probeAt) {
			if p.nextProbe.IsZero() || c.probeAt.Before(p.nextProbe) {
				p.nextProbe = c.probeAt
			}
			continue
		}
		p.probes = append(p.probes, topic)
		c.probing = true
		c.probeAt = now.Add(c.interval) // a probe that never reports waits one interval
		if p.nextProbe.IsZero() || c.probeAt.Before(p.nextProbe) {
			p.nextProbe = c.probeAt
		}
	}
	if len(p.except) > leasing.MaxClaimTopics {
		p.blocked = true
	}
	slices.Sort(p.except)
	slices.Sort(p.probes)
	return p
}

// requests returns the claims of the plan, from the processor's claim
// request base: the claim of what is not open (nil when blocked or when
// every topic of base is open), then one claim of one message per probe
// (of its topic, or of any topic when blocked).
func (p claimPlan) requests(base leasing.ClaimRequest) (claim *leasing.ClaimRequest, probes []leasing.ClaimRequest) {
	if p.blocked {
		if len(p.probes) > 0 {
			probe := base
			probe.BatchSize = 1
			probes = append(probes, probe)
		}
		return nil, probes
	}
	c := base
	switch {
	case len(p.except) == 0:
	case len(base.Topics) > 0:
		c.Topics = slices.DeleteFunc(slices.Clone(base.Topics), func(t string) bool { return slices.Contains(p.except, t) })
	default:
		c.ExceptTopics = p.except
	}
	if len(base.Topics) == 0 || len(c.Topics) > 0 {
		claim = &c
	}
	for _, topic := range p.probes {
		probe := base
		probe.BatchSize, probe.Topics, probe.ExceptTopics = 1, []string{topic}, nil
		probes = append(probes, probe)
	}
	return claim, probes
}

// isOpen reports whether m's circuit is open.
func (b *breaker) isOpen(m leasing.Message) bool {
	topic := b.topic(m)
	b.mu.Lock()
	defer b.mu.Unlock()
	c := b.circuits[topic]
	return c != nil && c.state == BreakerOpen
}
