package processor_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"sync/atomic"
	"time"

	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/processor"
)

// errNoResponders stands for a broker client's error while the broker is
// down.
var errNoResponders = errors.New("no responders")

// A relay whose handler tells the processor what failed: Unavailable while
// the broker is down (the message is released without spending an
// attempt, and the breaker stops the claims after a few in a row),
// Permanent for a message no broker will take (dead-lettered at once).
// Everything else is published, in order, once the broker is back.
func ExampleUnavailable() {
	ctx := context.Background()
	pool := examplePool() // a *pgxpool.Pool on a database migrated with db.MigrateUp
	defer pool.Close()

	outbox, err := leasing.NewPostgres(pool, leasing.Outbox, leasing.PostgresOptions{})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := outbox.Enqueue(ctx,
		leasing.NewMessage{Topic: "orders", OrderingKey: "order-1", Payload: []byte(`{"event":"placed"}`)},
		leasing.NewMessage{Topic: "orders", OrderingKey: "order-1", Payload: []byte(`not json`)},
		leasing.NewMessage{Topic: "orders", OrderingKey: "order-1", Payload: []byte(`{"event":"paid"}`)},
	); err != nil {
		log.Fatal(err)
	}

	var down atomic.Int32 // the broker refuses the first three publishes
	published := make(chan string, 3)
	publish := processor.Publisher(func(ctx context.Context, msg leasing.Message) error {
		if down.Add(1) <= 3 {
			return processor.Unavailable(fmt.Errorf("publish %s: %w", msg.Topic, errNoResponders))
		}
		if msg.Payload[0] != '{' {
			return processor.Permanent(errors.New("payload is not a JSON object"))
		}
		published <- string(msg.Payload)
		return nil
	})
	relay, err := processor.New(outbox, publish.Handler(), processor.Options{
		Owner:        "relay",
		PollInterval: 20 * time.Millisecond,
		RetryPolicy:  processor.RetryPolicy{InitialDelay: 50 * time.Millisecond},
		Breaker:      processor.BreakerPolicy{Threshold: 3, ProbeInterval: 50 * time.Millisecond},
	})
	if err != nil {
		log.Fatal(err)
	}
	ran := make(chan error, 1)
	go func() { ran <- relay.Run(ctx) }()

	fmt.Println("published:", <-published)
	fmt.Println("published:", <-published)
	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := relay.Stop(stopCtx); err != nil {
		log.Fatal(err)
	}
	if err := <-ran; err != nil {
		log.Fatal(err)
	}
	stats, err := outbox.Stats(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("dead-lettered:", stats.Depth[leasing.StatusDeadLettered])
	// Output:
	// published: {"event":"placed"}
	// published: {"event":"paid"}
	// dead-lettered: 1
}
