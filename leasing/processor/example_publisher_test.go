package processor_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/processor"
)

// Broker is the application's message broker client (Kafka, NATS, SQS, ...).
type Broker interface {
	// Publish returns nil once the broker has accepted body on topic.
	Publish(ctx context.Context, topic string, body []byte) error
}

// printBroker stands for a real broker: it prints what it is given and
// counts it on published.
type printBroker struct{ published chan<- struct{} }

func (b printBroker) Publish(ctx context.Context, topic string, body []byte) error {
	fmt.Printf("published on %s: %s\n", topic, body)
	b.published <- struct{}{}
	return nil
}

// An outbox relay: a Processor on the outbox whose handler is a Publisher
// that hands each message to the broker. A message is published at least
// once: a broker error, or a crash before the outcome is written, makes the
// relay publish it again later. The two events of one order share an
// ordering key, so "paid" is not claimed before "placed" is published,
// with any Concurrency and across retries and crashes (Concurrency 1
// alone does not keep order: a failed message is retried after the next).
func ExamplePublisher() {
	ctx := context.Background()
	pool := examplePool() // a *pgxpool.Pool on a database migrated with db.MigrateUp
	defer pool.Close()

	outbox, err := leasing.NewPostgres(pool, leasing.Outbox, leasing.PostgresOptions{})
	if err != nil {
		log.Fatal(err)
	}
	// Normally enqueued with EnqueueTx in the transaction of the change they announce.
	if _, err := outbox.Enqueue(ctx,
		leasing.NewMessage{Topic: "orders", OrderingKey: "order-1", Payload: []byte(`{"order":1,"event":"placed"}`)},
		leasing.NewMessage{Topic: "orders", OrderingKey: "order-1", Payload: []byte(`{"order":1,"event":"paid"}`)},
	); err != nil {
		log.Fatal(err)
	}

	published := make(chan struct{})
	var broker Broker = printBroker{published: published}
	publish := processor.Publisher(func(ctx context.Context, msg leasing.Message) error {
		return broker.Publish(ctx, msg.Topic, msg.Payload)
	})
	relay, err := processor.New(outbox, publish.Handler(), processor.Options{
		Owner: "relay",
	})
	if err != nil {
		log.Fatal(err)
	}
	ran := make(chan error, 1)
	go func() { ran <- relay.Run(ctx) }()

	<-published
	<-published
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
	// published on orders: {"order":1,"event":"placed"}
	// published on orders: {"order":1,"event":"paid"}
	// published: 2
}
