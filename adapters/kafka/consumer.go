package kafka

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/leasestore/leasestore/internal/brokermsg"
	"github.com/leasestore/leasestore/internal/wait"
	"github.com/leasestore/leasestore/leasing"
)

// Inbox is where a Consumer enqueues: the inbox store (a *leasing.Postgres
// on leasing.Inbox, or any leasing.Store of the inbox).
type Inbox = brokermsg.Enqueuer

// Consumer defaults.
const (
	DefaultMaxPollRecords = 500
	DefaultRetryDelay     = time.Second
)

// ConsumerOptions configures a Consumer.
type ConsumerOptions struct {
	// MaxPollRecords is the most records one poll, and one inbox enqueue,
	// takes, 1..10000. Defaults to DefaultMaxPollRecords.
	MaxPollRecords int
	// RetryDelay is the wait before a failed enqueue is tried again, > 0.
	// Defaults to DefaultRetryDelay.
	RetryDelay time.Duration
	// OnError receives the errors Run goes on after: fetch and commit
	// errors, failed enqueues, and each record the inbox refused (then
	// skipped: its offset is committed). Nil drops them.
	OnError func(error)
}

// Consumer moves records from a Kafka consumer group into the inbox.
type Consumer struct {
	cl    *kgo.Client
	inbox Inbox
	opts  ConsumerOptions
}

// NewConsumer returns a Consumer polling cl, a client in a consumer group
// (kgo.ConsumerGroup, kgo.ConsumeTopics) with kgo.DisableAutoCommit, that
// enqueues into inbox once Run is called. The client stays the caller's
// to close, after Run returned.
//
// Errors: a *leasing.ArgumentError for a nil client or inbox, a client
// without a group or with auto commit, or a bad option.
func NewConsumer(cl *kgo.Client, inbox Inbox, opts ConsumerOptions) (*Consumer, error) {
	if opts.MaxPollRecords == 0 {
		opts.MaxPollRecords = DefaultMaxPollRecords
	}
	if opts.RetryDelay == 0 {
		opts.RetryDelay = DefaultRetryDelay
	}
	switch {
	case cl == nil || inbox == nil:
		return nil, &leasing.ArgumentError{Field: "kafka client and inbox", Reason: "must not be nil"}
	case cl.OptValue(kgo.ConsumerGroup) == "":
		return nil, &leasing.ArgumentError{Field: "kafka client", Reason: "must consume in a group (kgo.ConsumerGroup)"}
	case cl.OptValue(kgo.DisableAutoCommit) != true:
		return nil, &leasing.ArgumentError{Field: "kafka client", Reason: "must not commit by itself (kgo.DisableAutoCommit): offsets are committed after the enqueue"}
	case opts.MaxPollRecords < 1 || opts.MaxPollRecords > 10000:
		return nil, &leasing.ArgumentError{Field: "max poll records", Reason: fmt.Sprintf("must be 1..10000, got %d", opts.MaxPollRecords)}
	case opts.RetryDelay < 0:
		return nil, &leasing.ArgumentError{Field: "retry delay", Reason: fmt.Sprintf("must be positive, got %s", opts.RetryDelay)}
	}
	return &Consumer{cl: cl, inbox: inbox, opts: opts}, nil
}

// Run polls until ctx is cancelled (or the client is closed), then returns
// nil. The records of one poll are enqueued into the inbox in one call,
// tried again after RetryDelay until it commits, and their offsets are
// committed only after that; a record the inbox refuses (bad input) is
// skipped. The idempotency key is the Leasestore-Message-Id header, else
// "<topic>/<partition>/<offset>".
func (c *Consumer) Run(ctx context.Context) error {
	for ctx.Err() == nil {
		fetches := c.cl.PollRecords(ctx, c.opts.MaxPollRecords)
		if fetches.IsClientClosed() {
			return nil
		}
		fetches.EachError(func(topic string, partition int32, err error) {
			if ctx.Err() == nil {
				c.report(fmt.Errorf("kafka: fetch %s/%d: %w", topic, partition, err))
			}
		})
		recs := fetches.Records()
		if len(recs) == 0 || !c.enqueue(ctx, recs) {
			continue
		}
		if err := c.cl.CommitRecords(context.WithoutCancel(ctx), recs...); err != nil {
			c.report(fmt.Errorf("kafka: commit: %w", err)) // redelivered; the inbox drops the copies
		}
	}
	return nil
}

// enqueue enqueues recs into the inbox until that commits, and reports
// whether it did before ctx ended.
func (c *Consumer) enqueue(ctx context.Context, recs []*kgo.Record) bool {
	msgs := make([]leasing.NewMessage, len(recs))
	for i, r := range recs {
		msgs[i] = inboxMessage(r)
	}
	for {
		var retry []int
		for i, err := range brokermsg.Enqueue(context.WithoutCancel(ctx), c.inbox, msgs) {
			switch {
			case err == nil:
			case brokermsg.IsPermanent(err):
				r := recs[i]
				c.report(fmt.Errorf("kafka: record %s/%d/%d skipped: %w", r.Topic, r.Partition, r.Offset, err))
			default:
				c.report(fmt.Errorf("kafka: enqueue: %w", err))
				retry = append(retry, i)
			}
		}
		if len(retry) == 0 {
			return true
		}
		if !wait.Sleep(ctx, c.opts.RetryDelay) {
			return false
		}
		again := make([]leasing.NewMessage, len(retry))
		for j, i := range retry {
			again[j] = msgs[i]
		}
		msgs = again
		recs = recsAt(recs, retry)
	}
}

func recsAt(recs []*kgo.Record, idx []int) []*kgo.Record {
	out := make([]*kgo.Record, len(idx))
	for j, i := range idx {
		out[j] = recs[i]
	}
	return out
}

// inboxMessage returns the inbox message of r.
func inboxMessage(r *kgo.Record) leasing.NewMessage {
	hs := make([]brokermsg.Header, 0, len(r.Headers))
	key := ""
	for _, h := range r.Headers {
		if h.Key == brokermsg.HeaderMessageID {
			key = string(h.Value)
		}
		hs = append(hs, brokermsg.Header{Key: h.Key, Value: string(h.Value)})
	}
	if key == "" {
		key = r.Topic + "/" + strconv.Itoa(int(r.Partition)) + "/" + strconv.FormatInt(r.Offset, 10)
	}
	return brokermsg.Incoming(hs, r.Value, key, r.Topic)
}

func (c *Consumer) report(err error) {
	if c.opts.OnError != nil {
		c.opts.OnError(err)
	}
}
