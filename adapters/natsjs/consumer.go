package natsjs

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/leasestore/leasestore/internal/brokermsg"
	"github.com/leasestore/leasestore/internal/wait"
	"github.com/leasestore/leasestore/leasing"
)

// Inbox is where a Consumer enqueues: the inbox store (a *leasing.Postgres
// on leasing.Inbox, or any leasing.Store of the inbox).
type Inbox = brokermsg.Enqueuer

// Consumer defaults.
const (
	DefaultFetchSize = 100
	DefaultNakDelay  = time.Second
)

// ConsumerOptions configures a Consumer.
type ConsumerOptions struct {
	// Stream is the stream to consume; required.
	Stream string
	// Durable is the durable consumer's name; required. NewConsumer
	// creates it, or updates its configuration to these options.
	Durable string
	// FilterSubjects limits the consumer to these subjects; none takes
	// every subject of the stream.
	FilterSubjects []string
	// FetchSize is the most messages one fetch, and one inbox enqueue,
	// takes, 1..10000. Defaults to DefaultFetchSize.
	FetchSize int
	// NakDelay is how long the stream waits before redelivering a message
	// whose enqueue failed, > 0. Defaults to DefaultNakDelay.
	NakDelay time.Duration
	// OnError receives the errors Run goes on after: a failed fetch or
	// enqueue, and each message the inbox refused (then terminated: it is
	// not redelivered). Nil drops them.
	OnError func(error)
}

// Consumer moves messages from a durable JetStream consumer into the inbox.
type Consumer struct {
	cons  jetstream.Consumer
	opts  ConsumerOptions
	inbox Inbox
}

// NewConsumer creates or updates the durable consumer opts.Durable on
// opts.Stream (explicit acks, deliver all) and returns a Consumer that
// enqueues its messages into inbox once Run is called.
//
// Errors: a *leasing.ArgumentError for a nil nc or inbox or a bad option;
// the server's error creating the consumer.
func NewConsumer(ctx context.Context, nc *nats.Conn, inbox Inbox, opts ConsumerOptions) (*Consumer, error) {
	if opts.FetchSize == 0 {
		opts.FetchSize = DefaultFetchSize
	}
	if opts.NakDelay == 0 {
		opts.NakDelay = DefaultNakDelay
	}
	var bad *leasing.ArgumentError
	switch {
	case nc == nil:
		bad = &leasing.ArgumentError{Field: "nats connection", Reason: "must not be nil"}
	case inbox == nil:
		bad = &leasing.ArgumentError{Field: "inbox", Reason: "must not be nil"}
	case opts.Stream == "" || opts.Durable == "":
		bad = &leasing.ArgumentError{Field: "stream and durable", Reason: "must not be empty"}
	case opts.FetchSize < 1 || opts.FetchSize > 10000:
		bad = &leasing.ArgumentError{Field: "fetch size", Reason: fmt.Sprintf("must be 1..10000, got %d", opts.FetchSize)}
	case opts.NakDelay < 0:
		bad = &leasing.ArgumentError{Field: "nak delay", Reason: fmt.Sprintf("must be positive, got %s", opts.NakDelay)}
	}
	if bad != nil {
		return nil, bad
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, opts.Stream, jetstream.ConsumerConfig{
		Durable:        opts.Durable,
		AckPolicy:      jetstream.AckExplicitPolicy,
		DeliverPolicy:  jetstream.DeliverAllPolicy,
		FilterSubjects: opts.FilterSubjects,
		MaxAckPending:  max(1000, 2*opts.FetchSize),
	})
	if err != nil {
		return nil, fmt.Errorf("natsjs: consumer %q on stream %q: %w", opts.Durable, opts.Stream, err)
	}
	return &Consumer{cons: cons, opts: opts, inbox: inbox}, nil
}

// Run fetches messages and enqueues each fetch into the inbox in one call,
// until ctx is cancelled; it then returns nil. A message is acked only
// after the enqueue that holds it committed (or found it a duplicate); a
// failed enqueue naks its messages with NakDelay; a message the inbox
// refuses (bad input) is terminated. The idempotency key is the message's
// Nats-Msg-Id, else "<stream>:<stream sequence>".
func (c *Consumer) Run(ctx context.Context) error {
	for ctx.Err() == nil {
		batch, err := c.cons.Fetch(c.opts.FetchSize, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			c.report(fmt.Errorf("natsjs: fetch: %w", err))
			wait.Sleep(ctx, c.opts.NakDelay)
			continue
		}
		var msgs []jetstream.Msg
		for m := range batch.Messages() {
			msgs = append(msgs, m)
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) && len(msgs) == 0 {
			c.report(fmt.Errorf("natsjs: fetch: %w", err))
			wait.Sleep(ctx, c.opts.NakDelay)
			continue
		}
		c.enqueue(ctx, msgs)
	}
	return nil
}

// enqueue enqueues msgs into the inbox and acks, naks or terminates each.
func (c *Consumer) enqueue(ctx context.Context, msgs []jetstream.Msg) {
	if len(msgs) == 0 {
		return
	}
	news := make([]leasing.NewMessage, len(msgs))
	for i, m := range msgs {
		news[i] = c.inboxMessage(m)
	}
	for i, err := range brokermsg.Enqueue(context.WithoutCancel(ctx), c.inbox, news) {
		m := msgs[i]
		switch {
		case err == nil:
			err = m.Ack()
		case brokermsg.IsPermanent(err):
			c.report(fmt.Errorf("natsjs: message %s terminated: %w", m.Headers().Get(jetstream.MsgIDHeader), err))
			err = m.Term()
		default:
			c.report(fmt.Errorf("natsjs: enqueue: %w", err))
			err = m.NakWithDelay(c.opts.NakDelay)
		}
		if err != nil {
			c.report(fmt.Errorf("natsjs: ack: %w", err)) // the message is redelivered; the inbox drops the copy
		}
	}
}

// inboxMessage returns the inbox message of m.
func (c *Consumer) inboxMessage(m jetstream.Msg) leasing.NewMessage {
	var hs []brokermsg.Header
	key := ""
	for k, vs := range m.Headers() {
		if k == jetstream.MsgIDHeader {
			key = vs[len(vs)-1]
			continue
		}
		for _, v := range vs {
			hs = append(hs, brokermsg.Header{Key: k, Value: v})
		}
	}
	if key == "" {
		if meta, err := m.Metadata(); err == nil {
			key = meta.Stream + ":" + strconv.FormatUint(meta.Sequence.Stream, 10)
		}
	}
	return brokermsg.Incoming(hs, m.Data(), key, m.Subject())
}

func (c *Consumer) report(err error) {
	if c.opts.OnError != nil {
		c.opts.OnError(err)
	}
}
