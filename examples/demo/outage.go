package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/processor"
)

// outagePass is the line the outage demo prints when its checks pass.
const outagePass = "PASS: the broker went down and came back: nothing dead-lettered, no attempt spent, each order's events published in order"

// outageDown is how long the demo's broker stays down.
const outageDown = 1500 * time.Millisecond

// runOutage shows a relay riding out a broker outage on the outbox: the
// broker is down when the relay starts; the handler says so with
// processor.Unavailable, which releases each message without spending an
// attempt, and the breaker stops the claims, probing with one message at a
// time, until the broker is back. It returns the failed checks.
func runOutage(ctx context.Context, out io.Writer, pool *pgxpool.Pool, cfg config) ([]string, error) {
	store, err := leasing.NewPostgres(pool, leasing.Outbox, leasing.PostgresOptions{})
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(out, "\nbroker outage: %d orders x 4 events on the outbox, the broker down for %s\n", len(orderingKeys), outageDown)
	var msgs []leasing.NewMessage
	for event := 1; event <= 4; event++ {
		for _, key := range orderingKeys {
			msgs = append(msgs, leasing.NewMessage{Topic: "shipments", Type: fmt.Sprintf("event-%d", event), OrderingKey: key})
		}
	}
	enqueued, err := store.Enqueue(ctx, msgs...)
	if err != nil {
		return nil, err
	}
	// count returns how many of the demo's messages match.
	count := func(match func(leasing.Row) bool) (int, error) {
		n := 0
		for _, id := range enqueued.IDs {
			row, err := store.Get(ctx, id)
			if err != nil {
				return 0, err
			}
			if match(row) {
				n++
			}
		}
		return n, nil
	}

	var (
		down      atomic.Bool
		refused   atomic.Int64
		mu        sync.Mutex
		published = map[string][]string{} // key -> event types, in publish order
	)
	down.Store(true)
	publish := processor.Publisher(func(_ context.Context, m leasing.Message) error {
		if down.Load() {
			refused.Add(1)
			return processor.Unavailable(errors.New("broker: connection refused"))
		}
		mu.Lock()
		defer mu.Unlock()
		published[m.OrderingKey] = append(published[m.OrderingKey], m.Type)
		return nil
	})
	// The breaker's own records, at WARN: opened, closed.
	logger := slog.New(breakerLog{slog.NewTextHandler(out, &slog.HandlerOptions{
		Level: slog.LevelWarn,
		ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
			if len(groups) == 0 && (a.Key == slog.TimeKey || a.Key == processor.LogKeyOwner || a.Key == processor.LogKeyQueue) {
				return slog.Attr{}
			}
			return a
		},
	})})
	p, err := processor.New(store, publish.Handler(), processor.Options{
		Owner: "relay", BatchSize: cfg.Batch, LeaseDuration: cfg.Lease, Concurrency: 4, PollInterval: 20 * time.Millisecond,
		Logger:  logger,
		Breaker: processor.BreakerPolicy{Threshold: 3, ProbeInterval: 100 * time.Millisecond, MaxProbeInterval: 400 * time.Millisecond},
	})
	if err != nil {
		return nil, err
	}
	runCtx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- p.Run(runCtx) }()
	start := time.Now()
	select {
	case <-time.After(outageDown):
	case err := <-ran:
		stop()
		return nil, err
	}
	down.Store(false)
	fmt.Fprintf(out, "  broker back after %s; %d publishes refused meanwhile\n", time.Since(start).Round(100*time.Millisecond), refused.Load())
	deadline := time.Now().Add(30 * time.Second)
	var left int
	for time.Now().Before(deadline) {
		if left, err = count(func(r leasing.Row) bool { return r.Status != leasing.StatusPublished }); err != nil {
			stop()
			return nil, err
		}
		if left == 0 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	stop()
	if err := <-ran; err != nil {
		return nil, err
	}

	var problems []string
	dead, err := count(func(r leasing.Row) bool { return r.Status == leasing.StatusDeadLettered })
	if err != nil {
		return nil, err
	}
	if dead > 0 || left > 0 {
		problems = append(problems, fmt.Sprintf("%d messages dead-lettered, %d not published", dead, left))
	}
	spent, err := count(func(r leasing.Row) bool { return r.AttemptCount > 1 })
	if err != nil {
		return nil, err
	}
	if spent > 0 {
		problems = append(problems, fmt.Sprintf("%d messages spent more than one attempt", spent))
	}
	mu.Lock()
	defer mu.Unlock()
	want := []string{"event-1", "event-2", "event-3", "event-4"}
	for _, key := range orderingKeys {
		fmt.Fprintf(out, "  %s published: %s\n", key, strings.Join(published[key], " "))
		if !slices.Equal(published[key], want) {
			problems = append(problems, fmt.Sprintf("%s: published %v, want %v", key, published[key], want))
		}
	}
	if len(problems) == 0 {
		fmt.Fprintln(out, outagePass)
	}
	return problems, nil
}

// breakerLog passes on the processor's breaker records only.
type breakerLog struct{ slog.Handler }

func (h breakerLog) Handle(ctx context.Context, r slog.Record) error {
	if !strings.HasPrefix(r.Message, "breaker ") {
		return nil
	}
	return h.Handler.Handle(ctx, r)
}

func (h breakerLog) WithAttrs(attrs []slog.Attr) slog.Handler {
	return breakerLog{h.Handler.WithAttrs(attrs)}
}
