package rabbitmq_test

import (
	"context"
	"log"

	"github.com/leasestore/leasestore/adapters/rabbitmq"
	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/processor"
)

// An outbox relay to RabbitMQ (each message to the queue its Topic names,
// through the default exchange) and an inbox fed from the payments queue.
func ExampleNewPublisher() {
	ctx := context.Background()
	var outbox, inbox leasing.Store // *leasing.Postgres on leasing.Outbox and leasing.Inbox
	const url = "amqp://guest:guest@127.0.0.1:5672/"

	pub, err := rabbitmq.NewPublisher(rabbitmq.PublisherOptions{URL: url})
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close()
	relay, err := processor.NewBatch(outbox, processor.BatchPublisher(pub.PublishBatch).Handler(), processor.Options{Owner: "relay"})
	if err != nil {
		log.Fatal(err)
	}
	go func() { _ = relay.Run(ctx) }()

	cons, err := rabbitmq.NewConsumer(inbox, rabbitmq.ConsumerOptions{URL: url, Queue: "payments"})
	if err != nil {
		log.Fatal(err)
	}
	go func() { _ = cons.Run(ctx) }()
}
