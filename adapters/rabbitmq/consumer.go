package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/leasestore/leasestore/internal/brokermsg"
	"github.com/leasestore/leasestore/internal/wait"
	"github.com/leasestore/leasestore/leasing"
)

// Inbox is where a Consumer enqueues: the inbox store (a *leasing.Postgres
// on leasing.Inbox, or any leasing.Store of the inbox).
type Inbox = brokermsg.Enqueuer

// Consumer defaults.
const (
	DefaultPrefetch   = 100
	DefaultRetryDelay = time.Second
)

// ConsumerOptions configures a Consumer.
type ConsumerOptions struct {
	// URL is the broker's AMQP URL; required.
	URL string
	// Queue is the queue to consume; required. It must exist.
	Queue string
	// Prefetch is the most unacked deliveries the broker sends ahead, and
	// the most one inbox enqueue takes, 1..65535. Defaults to
	// DefaultPrefetch.
	Prefetch int
	// RetryDelay is how long the consumer waits before it requeues the
	// deliveries of a failed enqueue, and before it dials again after the
	// connection was lost, > 0. Defaults to DefaultRetryDelay.
	RetryDelay time.Duration
	// OnError receives the errors Run goes on after: a lost connection, a
	// failed enqueue, and each message the inbox refused (then rejected
	// without requeue: to the queue's dead-letter exchange, if any). Nil
	// drops them.
	OnError func(error)
}

// Consumer moves deliveries from a RabbitMQ queue into the inbox.
type Consumer struct {
	opts  ConsumerOptions
	inbox Inbox
}

// NewConsumer returns a Consumer of opts.Queue that enqueues into inbox
// once Run is called.
//
// Errors: a *leasing.ArgumentError for a nil inbox or a bad option.
func NewConsumer(inbox Inbox, opts ConsumerOptions) (*Consumer, error) {
	if opts.Prefetch == 0 {
		opts.Prefetch = DefaultPrefetch
	}
	if opts.RetryDelay == 0 {
		opts.RetryDelay = DefaultRetryDelay
	}
	switch {
	case inbox == nil:
		return nil, &leasing.ArgumentError{Field: "inbox", Reason: "must not be nil"}
	case opts.URL == "" || opts.Queue == "":
		return nil, &leasing.ArgumentError{Field: "url and queue", Reason: "must not be empty"}
	case opts.Prefetch < 1 || opts.Prefetch > 65535:
		return nil, &leasing.ArgumentError{Field: "prefetch", Reason: fmt.Sprintf("must be 1..65535, got %d", opts.Prefetch)}
	case opts.RetryDelay < 0:
		return nil, &leasing.ArgumentError{Field: "retry delay", Reason: fmt.Sprintf("must be positive, got %s", opts.RetryDelay)}
	}
	return &Consumer{opts: opts, inbox: inbox}, nil
}

// Run consumes with manual acks until ctx is cancelled, then returns nil;
// it dials again, after RetryDelay, whenever the connection or channel is
// lost. The deliveries at hand (up to Prefetch) are enqueued into the
// inbox in one call and each is acked only after that enqueue committed
// (or found it a duplicate). A failed enqueue requeues its deliveries
// after RetryDelay; a delivery the inbox refuses (bad input) is rejected
// without requeue. The idempotency key is the message-id property; a
// message without one is enqueued without a key, so a redelivery of it is
// enqueued again.
func (c *Consumer) Run(ctx context.Context) error {
	for ctx.Err() == nil {
		if err := c.session(ctx); err != nil && ctx.Err() == nil {
			c.report(err)
			wait.Sleep(ctx, c.opts.RetryDelay)
		}
	}
	return nil
}

// session consumes on one connection until it is lost or ctx ends.
func (c *Consumer) session(ctx context.Context) error {
	conn, err := amqp.DialConfig(c.opts.URL, amqp.Config{Dial: amqp.DefaultDial(5 * time.Second)})
	if err != nil {
		return fmt.Errorf("rabbitmq: dial: %w", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("rabbitmq: open channel: %w", err)
	}
	if err := ch.Qos(c.opts.Prefetch, 0, false); err != nil {
		return fmt.Errorf("rabbitmq: qos: %w", err)
	}
	deliveries, err := ch.ConsumeWithContext(ctx, c.opts.Queue, "", false, false, false, false, nil)
	if err != nil {
		return fmt.Errorf("rabbitmq: consume %q: %w", c.opts.Queue, err)
	}
	for {
		var batch []amqp.Delivery
		select {
		case <-ctx.Done():
			return nil
		case d, ok := <-deliveries:
			if !ok {
				return errors.New("rabbitmq: delivery channel closed")
			}
			batch = append(batch, d)
		}
	more:
		for len(batch) < c.opts.Prefetch {
			select {
			case d, ok := <-deliveries:
				if !ok {
					break more
				}
				batch = append(batch, d)
			default:
				break more
			}
		}
		c.enqueue(ctx, batch)
	}
}

// enqueue enqueues batch into the inbox and acks, requeues or rejects each.
func (c *Consumer) enqueue(ctx context.Context, batch []amqp.Delivery) {
	msgs := make([]leasing.NewMessage, len(batch))
	for i, d := range batch {
		msgs[i] = inboxMessage(d)
	}
	errs := brokermsg.Enqueue(context.WithoutCancel(ctx), c.inbox, msgs)
	waited := false
	for i, err := range errs {
		d := batch[i]
		switch {
		case err == nil:
			err = d.Ack(false)
		case brokermsg.IsPermanent(err):
			c.report(fmt.Errorf("rabbitmq: message %s rejected: %w", d.MessageId, err))
			err = d.Reject(false)
		default:
			c.report(fmt.Errorf("rabbitmq: enqueue: %w", err))
			if !waited {
				wait.Sleep(ctx, c.opts.RetryDelay) // RabbitMQ has no delayed requeue
				waited = true
			}
			err = d.Nack(false, true)
		}
		if err != nil {
			c.report(fmt.Errorf("rabbitmq: ack: %w", err)) // redelivered; the inbox drops the copy
		}
	}
}

// inboxMessage returns the inbox message of d.
func inboxMessage(d amqp.Delivery) leasing.NewMessage {
	hs := make([]brokermsg.Header, 0, len(d.Headers)+1)
	if d.Type != "" {
		hs = append(hs, brokermsg.Header{Key: brokermsg.HeaderType, Value: d.Type})
	}
	for k, v := range d.Headers {
		s, ok := v.(string)
		if !ok {
			s = fmt.Sprint(v)
		}
		hs = append(hs, brokermsg.Header{Key: k, Value: s})
	}
	return brokermsg.Incoming(hs, d.Body, d.MessageId, d.RoutingKey)
}

func (c *Consumer) report(err error) {
	if c.opts.OnError != nil {
		c.opts.OnError(err)
	}
}
