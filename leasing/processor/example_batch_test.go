package processor_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/processor"
)

// fakeBatchBroker stands for a broker client with a batch call (Kafka's
// producer, SNS PublishBatch, a webhook taking an array): it prints each
// call and refuses the first try of one message, as a broker may refuse
// single entries of a batch.
type fakeBatchBroker struct {
	calls   int
	refused bool
	done    chan struct{}
}

func (b *fakeBatchBroker) PublishBatch(ctx context.Context, msgs []leasing.Message) []error {
	b.calls++
	fmt.Printf("broker call %d: %d messages\n", b.calls, len(msgs))
	errs := make([]error, len(msgs))
	for i, m := range msgs {
		if string(m.Payload) == `{"order":2}` && !b.refused {
			b.refused = true
			errs[i] = errors.New("broker: partition leader unavailable")
			fmt.Printf("  refused %s\n", m.Payload)
			continue
		}
		fmt.Printf("  accepted %s on %s\n", m.Payload, m.Topic)
	}
	if b.refused && b.calls == 2 {
		close(b.done)
	}
	return errs
}

// An outbox relay that publishes in batches: NewBatch hands the leases of
// each claim (up to BatchSize, here the broker's limit per call) to one
// BatchPublisher call, which returns one outcome per message. The message
// the broker refused is written as failed and published again after the
// retry delay; the others are written published, together.
func ExampleNewBatch() {
	ctx := context.Background()
	pool := examplePool() // a *pgxpool.Pool on a database migrated with db.MigrateUp
	defer pool.Close()

	outbox, err := leasing.NewPostgres(pool, leasing.Outbox, leasing.PostgresOptions{})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := outbox.Enqueue(ctx,
		leasing.NewMessage{Topic: "orders", Payload: []byte(`{"order":1}`)},
		leasing.NewMessage{Topic: "orders", Payload: []byte(`{"order":2}`)},
		leasing.NewMessage{Topic: "orders", Payload: []byte(`{"order":3}`)},
	); err != nil {
		log.Fatal(err)
	}

	broker := &fakeBatchBroker{done: make(chan struct{})}
	publish := processor.BatchPublisher(broker.PublishBatch)
	relay, err := processor.NewBatch(outbox, publish.Handler(), processor.Options{
		Owner:       "relay",
		BatchSize:   100, // the broker's limit per call
		Concurrency: 1,   // one broker call at a time
		RetryPolicy: processor.RetryPolicy{InitialDelay: 50 * time.Millisecond},
	})
	if err != nil {
		log.Fatal(err)
	}
	ran := make(chan error, 1)
	go func() { ran <- relay.Run(ctx) }()

	<-broker.done
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
	fmt.Println("published:", stats.Depth[leasing.StatusPublished])
	// Output:
	// broker call 1: 3 messages
	//   accepted {"order":1} on orders
	//   refused {"order":2}
	//   accepted {"order":3} on orders
	// broker call 2: 1 messages
	//   accepted {"order":2} on orders
	// published: 3
}
