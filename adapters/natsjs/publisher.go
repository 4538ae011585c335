// Package natsjs relays the outbox to NATS JetStream and feeds the inbox
// from it.
//
// A [Publisher] publishes each outbox message with its id as Nats-Msg-Id,
// so that the stream drops a second copy that arrives within its duplicate
// window; a duplicate's ack counts as published. NewPublisher refuses
// streams whose window is shorter than the relay can take to publish a
// message again ([DuplicateWindowError]). A [Consumer] pulls from a durable
// consumer, enqueues into the inbox with the Nats-Msg-Id (else the stream
// sequence) as idempotency key and acks only once the enqueue committed.
//
// Errors a publish returns carry the processor's verdicts:
// processor.Unavailable when the server or the stream cannot be reached
// (connection lost, timeout, no responders while the stream exists),
// processor.Permanent when no stream takes the subject or the message is
// too large. docs/brokers.md shows the wiring.
package natsjs

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/leasestore/leasestore/internal/brokermsg"
	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/processor"
)

// The headers a published message carries beside its own (trace context
// included) and Nats-Msg-Id: the outbox message's id, type, ordering key
// and tenant id, each only when set. The Consumer reads them back.
const (
	HeaderMessageID   = brokermsg.HeaderMessageID
	HeaderType        = brokermsg.HeaderType
	HeaderOrderingKey = brokermsg.HeaderOrderingKey
	HeaderTenantID    = brokermsg.HeaderTenantID
)

// DefaultAckTimeout is PublisherOptions.AckTimeout's default.
const DefaultAckTimeout = 5 * time.Second

// PublisherOptions configures a Publisher.
type PublisherOptions struct {
	// Streams names the streams the relay publishes into, at least one.
	// NewPublisher checks the duplicate window of each.
	Streams []string
	// Relay holds the options the relay's processor runs with: its
	// LeaseDuration and RetryPolicy (defaults filled in as the processor
	// fills them) give the duplicate window the streams need
	// (RequiredDuplicateWindow).
	Relay processor.Options
	// Subject returns the subject a message is published on; nil publishes
	// on Message.Topic.
	Subject func(leasing.Message) string
	// AckTimeout bounds the wait for the stream's ack of a publish, > 0.
	// Defaults to DefaultAckTimeout.
	AckTimeout time.Duration
}

// Publisher publishes outbox messages to JetStream. It is safe for
// concurrent use; Publish is a processor.Publisher and PublishBatch a
// processor.BatchPublisher.
type Publisher struct {
	js         jetstream.JetStream
	subject    func(leasing.Message) string
	ackTimeout time.Duration
}

// DuplicateWindowError is NewPublisher's refusal of a stream whose
// duplicate window is shorter than the relay may take to publish a message
// again: a copy published after the window closed is stored twice.
type DuplicateWindowError struct {
	// Stream is the stream's name.
	Stream string
	// Window is the stream's duplicate window (its Duplicates setting).
	Window time.Duration
	// Required is RequiredDuplicateWindow of the relay's options.
	Required time.Duration
}

// Error says which stream and by how much.
func (e *DuplicateWindowError) Error() string {
	return fmt.Sprintf("natsjs: stream %q keeps a duplicate window of %s, shorter than the %s the relay may take to publish a message again (lease duration + retry max delay); raise the stream's duplicate_window",
		e.Stream, e.Window, e.Required)
}

// RequiredDuplicateWindow returns the shortest duplicate window a stream
// needs so that the relay running with opts never stores a message twice:
// the lease duration (a relay that crashed after a publish leaves it until
// its lease expires) plus the retry policy's longest delay (a publish whose
// ack was lost is failed and published again after its backoff), each
// with the processor's default when zero.
func RequiredDuplicateWindow(opts processor.Options) time.Duration {
	lease := opts.LeaseDuration
	if lease == 0 {
		lease = processor.DefaultLeaseDuration
	}
	policy := opts.RetryPolicy
	policy.Jitter = 0
	return lease + policy.Backoff(math.MaxInt32) // the capped delay: MaxDelay with its default
}

// NewPublisher returns a publisher on nc's JetStream after checking that
// each of opts.Streams exists and keeps a duplicate window of at least
// RequiredDuplicateWindow(opts.Relay).
//
// Errors: a *leasing.ArgumentError for a nil nc, no stream or a negative
// AckTimeout; a *DuplicateWindowError for a stream whose window is too
// short; jetstream.ErrStreamNotFound (wrapped) for a missing stream; the
// server's error otherwise.
func NewPublisher(ctx context.Context, nc *nats.Conn, opts PublisherOptions) (*Publisher, error) {
	switch {
	case nc == nil:
		return nil, &leasing.ArgumentError{Field: "nats connection", Reason: "must not be nil"}
	case len(opts.Streams) == 0:
		return nil, &leasing.ArgumentError{Field: "streams", Reason: "must name at least one stream"}
	case opts.AckTimeout < 0:
		return nil, &leasing.ArgumentError{Field: "ack timeout", Reason: fmt.Sprintf("must not be negative, got %s", opts.AckTimeout)}
	}
	if opts.AckTimeout == 0 {
		opts.AckTimeout = DefaultAckTimeout
	}
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(opts.AckTimeout))
	if err != nil {
		return nil, err
	}
	required := RequiredDuplicateWindow(opts.Relay)
	for _, name := range opts.Streams {
		s, err := js.Stream(ctx, name)
		if err != nil {
			return nil, fmt.Errorf("natsjs: stream %q: %w", name, err)
		}
		if w := s.CachedInfo().Config.Duplicates; w < required {
			return nil, &DuplicateWindowError{Stream: name, Window: w, Required: required}
		}
	}
	subject := opts.Subject
	if subject == nil {
		subject = func(m leasing.Message) string { return m.Topic }
	}
	return &Publisher{js: js, subject: subject, ackTimeout: opts.AckTimeout}, nil
}

// Publish publishes msg and returns nil once the stream acked it, as
// stored or as a duplicate of a copy stored earlier.
//
// Errors: processor.Permanent for an empty subject, a message too large,
// or a subject no stream takes; processor.Unavailable for a lost
// connection, a timeout, or no responders while the stream exists; the
// context's error when ctx ends first; the server's error otherwise.
func (p *Publisher) Publish(ctx context.Context, msg leasing.Message) error {
	m, err := p.natsMsg(msg)
	if err != nil {
		return err
	}
	waitCtx, cancel := context.WithTimeout(ctx, p.ackTimeout)
	defer cancel()
	_, err = p.js.PublishMsg(waitCtx, m, jetstream.WithMsgID(msg.ID.String()))
	return p.classify(ctx, m.Subject, err) // ctx: its end is the caller's, waitCtx's a timeout
}

// PublishBatch publishes msgs without waiting between them and returns one
// outcome per message, in order, each as Publish returns it.
func (p *Publisher) PublishBatch(ctx context.Context, msgs []leasing.Message) []error {
	errs := make([]error, len(msgs))
	futures := make([]jetstream.PubAckFuture, len(msgs))
	for i, msg := range msgs {
		m, err := p.natsMsg(msg)
		if err == nil {
			futures[i], err = p.js.PublishMsgAsync(m, jetstream.WithMsgID(msg.ID.String()))
		}
		errs[i] = err
	}
	waitCtx, cancel := context.WithTimeout(ctx, p.ackTimeout)
	defer cancel()
	for i, f := range futures {
		if f == nil {
			if errs[i] != nil {
				errs[i] = p.classify(ctx, p.subject(msgs[i]), errs[i])
			}
			continue
		}
		var err error
		select {
		case <-f.Ok():
		case err = <-f.Err():
		case <-waitCtx.Done():
			err = ctx.Err()
			if err == nil {
				err = jetstream.ErrAsyncPublishTimeout
			}
		}
		errs[i] = p.classify(ctx, f.Msg().Subject, err)
	}
	return errs
}

// natsMsg returns the JetStream message of msg.
func (p *Publisher) natsMsg(msg leasing.Message) (*nats.Msg, error) {
	subject := p.subject(msg)
	if subject == "" {
		return nil, processor.Permanent(fmt.Errorf("natsjs: message %s has no subject", msg.ID))
	}
	m := nats.NewMsg(subject)
	m.Data = msg.Payload
	for _, h := range brokermsg.Outgoing(msg) {
		m.Header.Add(h.Key, h.Value)
	}
	return m, nil
}

// classify returns err, the outcome of a publish on subject, with its
// verdict.
func (p *Publisher) classify(ctx context.Context, subject string, err error) error {
	var apiErr *jetstream.APIError
	switch {
	case err == nil:
		return nil
	case errors.Is(err, nats.ErrMaxPayload),
		errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamMessageExceedsMaximum:
		return processor.Permanent(fmt.Errorf("natsjs: message too large for %q: %w", subject, err))
	case errors.Is(err, jetstream.ErrNoStreamResponse), errors.Is(err, nats.ErrNoResponders):
		// No stream answered: none takes the subject, or its leader is away.
		lookCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.ackTimeout)
		defer cancel()
		if _, lookErr := p.js.StreamNameBySubject(lookCtx, subject); errors.Is(lookErr, jetstream.ErrStreamNotFound) {
			return processor.Permanent(fmt.Errorf("natsjs: no stream takes subject %q: %w", subject, err))
		}
		return processor.Unavailable(fmt.Errorf("natsjs: publish on %q: %w", subject, err))
	case ctx.Err() != nil:
		return err // the lease was lost, the handler timed out, or shutdown
	case unavailable(err):
		return processor.Unavailable(fmt.Errorf("natsjs: publish on %q: %w", subject, err))
	}
	return err
}

// unavailable reports whether err says the server could not be reached or
// did not answer in time.
func unavailable(err error) bool {
	for _, target := range []error{
		nats.ErrTimeout, context.DeadlineExceeded, jetstream.ErrAsyncPublishTimeout,
		jetstream.ErrTooManyStalledMsgs, nats.ErrConnectionClosed, nats.ErrConnectionDraining,
		nats.ErrConnectionReconnecting, nats.ErrDisconnected, nats.ErrNoServers, nats.ErrStaleConnection,
	} {
		if errors.Is(err, target) {
			return true
		}
	}
	return false
}
