// Package kafka relays the outbox to Kafka and feeds the inbox from it,
// over franz-go.
//
// A [Publisher] produces each outbox message with its ordering key as the
// record key, so that a key keeps one partition and its order, and the
// outbox id in the Leasestore-Message-Id header, on a client with the
// idempotent producer and acks=all (NewPublisher refuses another). The
// idempotent producer dedups the retries of one producer session only: a
// relay that crashed, or a publish whose outcome was lost, produces the
// message again. The [Consumer] enqueues into the inbox with the message
// id as idempotency key, so the inbox holds it once, and commits offsets
// only after the enqueue committed.
//
// Errors a publish returns carry the processor's verdicts:
// processor.Unavailable for a lost broker, a timeout or a retriable Kafka
// error; processor.Permanent for a topic that does not exist, a record too
// large, or a record the broker refuses. docs/brokers.md shows the wiring.
package kafka

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/leasestore/leasestore/internal/brokermsg"
	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/processor"
)

// The headers a produced record carries beside its own (trace context
// included): the outbox message's id, type, ordering key and tenant id,
// each only when set. The Consumer reads them back.
const (
	HeaderMessageID   = brokermsg.HeaderMessageID
	HeaderType        = brokermsg.HeaderType
	HeaderOrderingKey = brokermsg.HeaderOrderingKey
	HeaderTenantID    = brokermsg.HeaderTenantID
)

// DefaultAckTimeout is PublisherOptions.AckTimeout's default.
const DefaultAckTimeout = 10 * time.Second

// PublisherOptions configures a Publisher.
type PublisherOptions struct {
	// Topic returns the Kafka topic of a message; nil uses Message.Topic.
	Topic func(leasing.Message) string
	// AckTimeout bounds the wait for a produce, > 0. Defaults to
	// DefaultAckTimeout. A record already sent is not abandoned by the
	// idempotent producer: give the client kgo.RecordDeliveryTimeout to
	// bound that too.
	AckTimeout time.Duration
}

// Publisher produces outbox messages to Kafka. It is safe for concurrent
// use; Publish is a processor.Publisher and PublishBatch a
// processor.BatchPublisher. The client stays the caller's to close.
type Publisher struct {
	cl   *kgo.Client
	opts PublisherOptions
}

// NewPublisher returns a publisher producing through cl.
//
// Errors: a *leasing.ArgumentError for a nil client, a client whose
// idempotent producer is disabled (kgo.DisableIdempotentWrite) or whose
// acks are not all in-sync replicas (kgo.RequiredAcks), or a negative
// AckTimeout.
func NewPublisher(cl *kgo.Client, opts PublisherOptions) (*Publisher, error) {
	switch {
	case cl == nil:
		return nil, &leasing.ArgumentError{Field: "kafka client", Reason: "must not be nil"}
	case cl.OptValue(kgo.DisableIdempotentWrite) == true:
		return nil, &leasing.ArgumentError{Field: "kafka client", Reason: "must keep the idempotent producer (no kgo.DisableIdempotentWrite)"}
	case cl.OptValue(kgo.RequiredAcks) != kgo.AllISRAcks():
		return nil, &leasing.ArgumentError{Field: "kafka client", Reason: "must wait for all in-sync replicas (kgo.RequiredAcks(kgo.AllISRAcks()))"}
	case opts.AckTimeout < 0:
		return nil, &leasing.ArgumentError{Field: "ack timeout", Reason: fmt.Sprintf("must not be negative, got %s", opts.AckTimeout)}
	}
	if opts.AckTimeout == 0 {
		opts.AckTimeout = DefaultAckTimeout
	}
	if opts.Topic == nil {
		opts.Topic = func(m leasing.Message) string { return m.Topic }
	}
	return &Publisher{cl: cl, opts: opts}, nil
}

// Publish produces msg and returns nil once every in-sync replica has it.
//
// Errors: processor.Permanent for an empty or unknown topic, a record too
// large or refused; processor.Unavailable for a lost broker, a timeout or
// a retriable error; the context's error when ctx ends first.
func (p *Publisher) Publish(ctx context.Context, msg leasing.Message) error {
	return p.PublishBatch(ctx, []leasing.Message{msg})[0]
}

// PublishBatch produces msgs without waiting between them and returns one
// outcome per message, in order, each as Publish returns it.
func (p *Publisher) PublishBatch(ctx context.Context, msgs []leasing.Message) []error {
	errs := make([]error, len(msgs))
	ctx, cancel := context.WithTimeout(ctx, p.opts.AckTimeout)
	defer cancel()
	done := make([]chan error, len(msgs)) // buffered: a promise that comes after the wait ended is dropped
	for i, msg := range msgs {
		r := p.record(msg)
		if r.Topic == "" {
			errs[i] = processor.Permanent(fmt.Errorf("kafka: message %s has no topic", msg.ID))
			continue
		}
		done[i] = make(chan error, 1)
		p.cl.Produce(ctx, r, func(_ *kgo.Record, err error) { done[i] <- err })
	}
	for i, ch := range done {
		if ch == nil {
			continue
		}
		var err error
		select {
		case err = <-ch:
		case <-ctx.Done():
			// The idempotent producer keeps a record it sent until the broker
			// answers; it may still be produced: the inbox drops the copy the
			// retry makes.
			err = fmt.Errorf("kafka: no ack: %w", context.Cause(ctx))
		}
		errs[i] = classify(ctx, msgs[i].ID.String(), p.opts.Topic(msgs[i]), err)
	}
	return errs
}

// record returns the Kafka record of msg.
func (p *Publisher) record(msg leasing.Message) *kgo.Record {
	r := &kgo.Record{Topic: p.opts.Topic(msg), Value: msg.Payload}
	if msg.OrderingKey != "" {
		r.Key = []byte(msg.OrderingKey)
	}
	for _, h := range brokermsg.Outgoing(msg) {
		r.Headers = append(r.Headers, kgo.RecordHeader{Key: h.Key, Value: []byte(h.Value)})
	}
	return r
}

// classify returns err, the outcome of a produce to topic, with its
// verdict.
func classify(ctx context.Context, id, topic string, err error) error {
	var netErr net.Error
	switch {
	case err == nil:
		return nil
	case errors.Is(err, kerr.UnknownTopicOrPartition), errors.Is(err, kerr.InvalidTopicException):
		return processor.Permanent(fmt.Errorf("kafka: message %s: no topic %q: %w", id, topic, err))
	case errors.Is(err, kerr.MessageTooLarge), errors.Is(err, kerr.RecordListTooLarge), errors.Is(err, kerr.InvalidRecord):
		return processor.Permanent(fmt.Errorf("kafka: message %s refused by %q: %w", id, topic, err))
	case ctx.Err() != nil && !errors.Is(context.Cause(ctx), context.DeadlineExceeded):
		return err // the lease was lost, the handler timed out, or shutdown
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, kgo.ErrRecordTimeout),
		errors.Is(err, kgo.ErrRecordRetries), errors.Is(err, kgo.ErrMaxBuffered), errors.Is(err, kgo.ErrClientClosed), errors.As(err, &netErr), kerr.IsRetriable(err):
		return processor.Unavailable(fmt.Errorf("kafka: message %s to %q: %w", id, topic, err))
	}
	return err
}
