package natsjs_test

import (
	"context"
	"log"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/leasestore/leasestore/adapters/natsjs"
	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/processor"
)

// An outbox relay to the ORDERS stream and an inbox fed from the PAYMENTS
// stream. NewPublisher refuses ORDERS when its duplicate window is shorter
// than the relay's lease plus its longest retry delay (90 s here).
// examples/orders runs the same wiring end to end.
func ExampleNewPublisher() {
	ctx := context.Background()
	var outbox, inbox leasing.Store // *leasing.Postgres on leasing.Outbox and leasing.Inbox

	nc, err := nats.Connect(nats.DefaultURL, nats.MaxReconnects(-1))
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()

	relayOpts := processor.Options{Owner: "relay", BatchSize: 100, LeaseDuration: 30 * time.Second,
		RetryPolicy: processor.RetryPolicy{MaxDelay: time.Minute}}
	pub, err := natsjs.NewPublisher(ctx, nc, natsjs.PublisherOptions{Streams: []string{"ORDERS"}, Relay: relayOpts})
	if err != nil {
		log.Fatal(err) // a *natsjs.DuplicateWindowError when ORDERS keeps a window below 90s
	}
	relay, err := processor.NewBatch(outbox, processor.BatchPublisher(pub.PublishBatch).Handler(), relayOpts)
	if err != nil {
		log.Fatal(err)
	}
	go func() { _ = relay.Run(ctx) }()

	cons, err := natsjs.NewConsumer(ctx, nc, inbox, natsjs.ConsumerOptions{Stream: "PAYMENTS", Durable: "orders-inbox"})
	if err != nil {
		log.Fatal(err)
	}
	go func() { _ = cons.Run(ctx) }()
}
