package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/processor"
)

// orderingKeys are the keys of the ordering demo: the events of three
// orders, five each, enqueued interleaved.
var orderingKeys = []string{"order-1", "order-2", "order-3"}

// orderingPass is the line the ordering demo prints when its checks pass.
const orderingPass = "PASS: every order's events were handled in enqueue order, one at a time, while order-2's first event failed and retried"

// runOrdering shows ordering keys on the inbox: 3 orders x 5 events,
// enqueued interleaved, handled by two processor instances. The first
// event of order-2 fails twice; its key waits out each backoff (no later
// event of order-2 is handled meanwhile) while the other orders go on.
// It returns the failed checks.
func runOrdering(ctx context.Context, out io.Writer, pool *pgxpool.Pool, cfg config) ([]string, error) {
	store, err := leasing.NewPostgres(pool, leasing.Inbox, leasing.PostgresOptions{})
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(out, "\nordering keys: %d orders x 5 events on the inbox, two instances\n", len(orderingKeys))
	enqueued := map[string][]uuid.UUID{}
	for event := 1; event <= 5; event++ {
		msgs := make([]leasing.NewMessage, len(orderingKeys))
		for i, key := range orderingKeys {
			msgs[i] = leasing.NewMessage{Type: fmt.Sprintf("event-%d", event), OrderingKey: key, Payload: []byte(key)}
		}
		res, err := store.Enqueue(ctx, msgs...)
		if err != nil {
			return nil, err
		}
		for i, id := range res.IDs {
			enqueued[msgs[i].OrderingKey] = append(enqueued[msgs[i].OrderingKey], id)
		}
	}
	failing := enqueued["order-2"][0]

	var (
		mu        sync.Mutex
		succeeded = map[string][]uuid.UUID{}
		log       []string
		busy      = map[string]bool{} // keys with a handler running
		overlap   []string
	)
	handler := func(instance string) processor.Handler {
		return func(_ context.Context, l leasing.Lease) error {
			key := l.Message.OrderingKey
			mu.Lock()
			if busy[key] {
				overlap = append(overlap, key)
			}
			busy[key] = true
			mu.Unlock()
			time.Sleep(20 * time.Millisecond)
			mu.Lock()
			defer mu.Unlock()
			busy[key] = false
			if l.Message.ID == failing && l.Attempt < 3 {
				log = append(log, fmt.Sprintf("  %s %s %s: attempt %d fails; %s waits for its retry", instance, key, l.Message.Type, l.Attempt, key))
				return errors.New("broker unavailable")
			}
			succeeded[key] = append(succeeded[key], l.Message.ID)
			log = append(log, fmt.Sprintf("  %s %s %s: done (attempt %d)", instance, key, l.Message.Type, l.Attempt))
			return nil
		}
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	ran := make(chan error, 2) // what each processor's Run returned, nil after a shutdown
	for _, instance := range []string{"A", "B"} {
		p, err := processor.New(store, handler(instance), processor.Options{
			Owner: "keyed-" + instance, BatchSize: cfg.Batch, LeaseDuration: cfg.Lease, Concurrency: 4,
			PollInterval: 20 * time.Millisecond,
			RetryPolicy:  processor.RetryPolicy{InitialDelay: 150 * time.Millisecond},
		})
		if err != nil {
			return nil, err
		}
		wg.Go(func() { ran <- p.Run(runCtx) })
	}
	deadline := time.Now().Add(time.Minute)
	var runErr error
	for runErr == nil {
		mu.Lock()
		n := 0
		for _, ids := range succeeded {
			n += len(ids)
		}
		mu.Unlock()
		if n == 5*len(orderingKeys) || time.Now().After(deadline) {
			break
		}
		select {
		case runErr = <-ran: // a processor stopped before shutdown: its role lacks a privilege
		case <-time.After(20 * time.Millisecond):
		}
	}
	stop()
	wg.Wait()
	close(ran)
	for err := range ran {
		runErr = cmp.Or(runErr, err)
	}
	if runErr != nil {
		return nil, runErr
	}

	mu.Lock()
	defer mu.Unlock()
	for _, line := range log {
		fmt.Fprintln(out, line)
	}
	var problems []string
	for _, key := range orderingKeys {
		if !slices.Equal(succeeded[key], enqueued[key]) {
			problems = append(problems, fmt.Sprintf("%s: handled %d events out of enqueue order", key, len(succeeded[key])))
		}
	}
	if len(overlap) > 0 {
		problems = append(problems, fmt.Sprintf("two handlers of one key ran at once: %v", overlap))
	}
	if len(problems) == 0 {
		fmt.Fprintln(out, orderingPass)
	}
	return problems, nil
}
