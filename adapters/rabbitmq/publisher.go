// Package rabbitmq relays the outbox to RabbitMQ and feeds the inbox from
// it, over amqp091-go.
//
// A [Publisher] publishes each outbox message persistent, mandatory, with
// its id as the message-id property, and returns only once the broker
// confirmed it (publisher confirms). RabbitMQ deduplicates nothing: a
// message whose confirm was lost is published again, so a queue may hold
// it twice; the [Consumer] enqueues into the inbox with the message-id as
// idempotency key, so the inbox holds it once, and acks (manual acks) only
// after the enqueue committed. A closed channel or connection is dialled
// again on the next call.
//
// Errors a publish returns carry the processor's verdicts:
// processor.Unavailable for a lost connection or channel, a timeout or a
// nack; processor.Permanent for a message no queue is bound to take
// (returned as unroutable) or larger than the broker's max message size.
// docs/brokers.md shows the wiring.
package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"net"
	"regexp"
	"strconv"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/leasestore/leasestore/internal/brokermsg"
	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/processor"
)

// The headers a published message carries beside its own (trace context
// included): the outbox message's id, type, ordering key and tenant id,
// each only when set. The Consumer reads them back.
const (
	HeaderMessageID   = brokermsg.HeaderMessageID
	HeaderType        = brokermsg.HeaderType
	HeaderOrderingKey = brokermsg.HeaderOrderingKey
	HeaderTenantID    = brokermsg.HeaderTenantID
)

// DefaultConfirmTimeout is PublisherOptions.ConfirmTimeout's default.
const DefaultConfirmTimeout = 5 * time.Second

// PublisherOptions configures a Publisher.
type PublisherOptions struct {
	// URL is the broker's AMQP URL, e.g.
	// "amqp://guest:guest@127.0.0.1:5672/"; required.
	URL string
	// Exchange is the exchange messages are published to; "" is the
	// default exchange, which routes a message to the queue its routing
	// key names.
	Exchange string
	// RoutingKey returns a message's routing key; nil uses Message.Topic.
	RoutingKey func(leasing.Message) string
	// ConfirmTimeout bounds the dial and the wait for the broker's
	// confirm of a publish, > 0. Defaults to DefaultConfirmTimeout.
	ConfirmTimeout time.Duration
}

// Publisher publishes outbox messages to RabbitMQ on one channel in
// confirm mode, dialled again after it or its connection closed. It is safe
// for concurrent use; Publish is a processor.Publisher and PublishBatch a
// processor.BatchPublisher. Close it when done.
type Publisher struct {
	opts PublisherOptions

	mu     sync.Mutex
	conn   *amqp.Connection
	ch     *channel
	closed bool
}

// channel is one confirm-mode channel and what it tells of itself.
type channel struct {
	ch      *amqp.Channel
	closing chan *amqp.Error // the channel's close reason, once
	returns chan amqp.Return // unroutable messages, before their confirm

	mu       sync.Mutex
	returned map[string]amqp.Return // by message-id, drained from returns
	reason   *amqp.Error            // the close reason, once received
}

// closeReason returns why the broker closed the channel, nil while it is
// open or when the client closed it.
func (c *channel) closeReason() *amqp.Error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.reason == nil {
		select {
		case r := <-c.closing:
			c.reason = r
		default:
		}
	}
	return c.reason
}

// NewPublisher returns a publisher to opts.URL, connected.
//
// Errors: a *leasing.ArgumentError for an empty URL or a negative
// ConfirmTimeout; the dial's error, as processor.Unavailable.
func NewPublisher(opts PublisherOptions) (*Publisher, error) {
	switch {
	case opts.URL == "":
		return nil, &leasing.ArgumentError{Field: "url", Reason: "must not be empty"}
	case opts.ConfirmTimeout < 0:
		return nil, &leasing.ArgumentError{Field: "confirm timeout", Reason: fmt.Sprintf("must not be negative, got %s", opts.ConfirmTimeout)}
	}
	if opts.ConfirmTimeout == 0 {
		opts.ConfirmTimeout = DefaultConfirmTimeout
	}
	if opts.RoutingKey == nil {
		opts.RoutingKey = func(m leasing.Message) string { return m.Topic }
	}
	p := &Publisher{opts: opts}
	if _, err := p.channel(); err != nil {
		return nil, err
	}
	return p, nil
}

// Close closes the connection; later publishes fail.
func (p *Publisher) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	if p.conn == nil {
		return nil
	}
	err := p.conn.Close()
	p.conn, p.ch = nil, nil
	if errors.Is(err, amqp.ErrClosed) {
		return nil
	}
	return err
}

// errPublisherClosed is returned by a publish after Close.
var errPublisherClosed = errors.New("rabbitmq: publisher closed")

// channel returns the open channel, dialling a connection and opening a
// channel when either was closed.
func (p *Publisher) channel() (*channel, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, errPublisherClosed
	}
	if p.ch != nil && !p.ch.ch.IsClosed() {
		return p.ch, nil
	}
	if p.conn == nil || p.conn.IsClosed() {
		conn, err := amqp.DialConfig(p.opts.URL, amqp.Config{Dial: amqp.DefaultDial(p.opts.ConfirmTimeout)})
		if err != nil {
			return nil, processor.Unavailable(fmt.Errorf("rabbitmq: dial: %w", err))
		}
		p.conn = conn
	}
	ch, err := p.conn.Channel()
	if err == nil {
		err = ch.Confirm(false)
	}
	if err != nil {
		_ = p.conn.Close()
		p.conn = nil
		return nil, processor.Unavailable(fmt.Errorf("rabbitmq: open channel: %w", err))
	}
	c := &channel{ch: ch, returned: map[string]amqp.Return{}}
	c.closing = ch.NotifyClose(make(chan *amqp.Error, 1))
	c.returns = ch.NotifyReturn(make(chan amqp.Return, 1024))
	p.ch = c
	return c, nil
}

// Publish publishes msg and returns nil once the broker confirmed it.
//
// Errors: processor.Permanent for an empty routing key, an unroutable
// message or one larger than the broker takes; processor.Unavailable for
// a lost connection or channel, a timeout or a nack; the context's error
// when ctx ends first.
func (p *Publisher) Publish(ctx context.Context, msg leasing.Message) error {
	return p.PublishBatch(ctx, []leasing.Message{msg})[0]
}

// PublishBatch publishes msgs without waiting between them, then waits
// for their confirms, and returns one outcome per message, in order, each
// as Publish returns it.
func (p *Publisher) PublishBatch(ctx context.Context, msgs []leasing.Message) []error {
	errs := make([]error, len(msgs))
	c, err := p.channel()
	if err != nil {
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	ctx, cancel := context.WithTimeout(ctx, p.opts.ConfirmTimeout)
	defer cancel()
	confirms := make([]*amqp.DeferredConfirmation, len(msgs))
	for i, msg := range msgs {
		key := p.opts.RoutingKey(msg)
		if key == "" && p.opts.Exchange == "" {
			errs[i] = processor.Permanent(fmt.Errorf("rabbitmq: message %s has no routing key", msg.ID))
			continue
		}
		confirms[i], errs[i] = c.ch.PublishWithDeferredConfirmWithContext(ctx, p.opts.Exchange, key, true, false, publishing(msg))
	}
	for i, dc := range confirms {
		if dc != nil {
			errs[i] = c.confirmed(ctx, dc, msgs[i])
		} else if errs[i] != nil && !brokermsg.IsPermanent(errs[i]) {
			errs[i] = c.classify(ctx, msgs[i], errs[i])
		}
	}
	if ctx.Err() != nil {
		p.drop(c) // confirms that did not come leave the channel in doubt
	}
	return errs
}

// publishing returns the AMQP message of msg: persistent, with its id as
// message-id and its type as type.
func publishing(msg leasing.Message) amqp.Publishing {
	headers := amqp.Table{}
	for _, h := range brokermsg.Outgoing(msg) {
		headers[h.Key] = h.Value
	}
	return amqp.Publishing{
		Headers: headers, DeliveryMode: amqp.Persistent, MessageId: msg.ID.String(),
		Type: msg.Type, Body: msg.Payload,
	}
}

// confirmed waits for dc, the confirm of msg, and returns its outcome.
func (c *channel) confirmed(ctx context.Context, dc *amqp.DeferredConfirmation, msg leasing.Message) error {
	acked, err := dc.WaitContext(ctx)
	if err != nil {
		return c.classify(ctx, msg, err)
	}
	if ret, ok := c.takeReturn(msg.ID.String()); ok {
		return processor.Permanent(fmt.Errorf("rabbitmq: message %s unroutable: exchange %q, routing key %q: %d %s",
			msg.ID, ret.Exchange, ret.RoutingKey, ret.ReplyCode, ret.ReplyText))
	}
	if !acked {
		return c.classify(ctx, msg, errNack)
	}
	return nil
}

// errNack is the error of a publish the broker nacked or whose channel
// closed before its confirm.
var errNack = errors.New("rabbitmq: publish not confirmed")

// takeReturn drains the returns received so far (all those of messages
// confirmed already: a return comes before its confirm) and takes the one
// of message id.
func (c *channel) takeReturn(id string) (amqp.Return, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for drained := false; !drained; {
		select {
		case r, ok := <-c.returns:
			if !ok {
				drained = true
				break
			}
			c.returned[r.MessageId] = r
		default:
			drained = true
		}
	}
	r, ok := c.returned[id]
	delete(c.returned, id)
	return r, ok
}

// tooLarge matches the reason RabbitMQ closes a channel with for a
// message above its max_message_size.
var tooLarge = regexp.MustCompile(`message size (\d+) is larger than configured max size`)

// classify returns err, a failed publish of msg on c, with its verdict.
func (c *channel) classify(ctx context.Context, msg leasing.Message, err error) error {
	if errors.Is(err, errNack) || errors.Is(err, amqp.ErrClosed) {
		if reason := c.closeReason(); reason != nil {
			if m := tooLarge.FindStringSubmatch(reason.Reason); m != nil && reason.Code == amqp.PreconditionFailed {
				if n, _ := strconv.Atoi(m[1]); n == len(msg.Payload) {
					return processor.Permanent(fmt.Errorf("rabbitmq: message %s too large: %w", msg.ID, reason))
				}
			}
			if reason.Code == amqp.NotFound { // the exchange does not exist
				return processor.Permanent(fmt.Errorf("rabbitmq: message %s: no such exchange: %w", msg.ID, reason))
			}
			err = fmt.Errorf("%w: channel closed: %w", err, reason)
		}
		return processor.Unavailable(err)
	}
	var netErr net.Error
	switch {
	case ctx.Err() != nil && !errors.Is(context.Cause(ctx), context.DeadlineExceeded):
		return err // the lease was lost, the handler timed out, or shutdown
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &netErr):
		return processor.Unavailable(fmt.Errorf("rabbitmq: publish: %w", err))
	}
	var amqpErr *amqp.Error
	if errors.As(err, &amqpErr) {
		return processor.Unavailable(fmt.Errorf("rabbitmq: publish: %w", err))
	}
	return err
}

// drop closes c when it is still the publisher's channel, so that the
// next call opens another.
func (p *Publisher) drop(c *channel) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ch == c {
		_ = c.ch.Close()
		p.ch = nil
	}
}
