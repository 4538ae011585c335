package kafka_test

import (
	"context"
	"log"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/leasestore/leasestore/adapters/kafka"
	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/processor"
)

// An outbox relay to Kafka (franz-go's defaults: idempotent producer,
// acks=all) and an inbox fed by a consumer group that commits after the
// enqueue.
func ExampleNewPublisher() {
	ctx := context.Background()
	var outbox, inbox leasing.Store // *leasing.Postgres on leasing.Outbox and leasing.Inbox
	seeds := []string{"127.0.0.1:9092"}

	producer, err := kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.RecordDeliveryTimeout(30*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	defer producer.Close()
	pub, err := kafka.NewPublisher(producer, kafka.PublisherOptions{})
	if err != nil {
		log.Fatal(err)
	}
	relay, err := processor.NewBatch(outbox, processor.BatchPublisher(pub.PublishBatch).Handler(), processor.Options{Owner: "relay"})
	if err != nil {
		log.Fatal(err)
	}
	go func() { _ = relay.Run(ctx) }()

	group, err := kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.ConsumerGroup("orders-inbox"),
		kgo.ConsumeTopics("payments"), kgo.DisableAutoCommit())
	if err != nil {
		log.Fatal(err)
	}
	defer group.Close()
	cons, err := kafka.NewConsumer(group, inbox, kafka.ConsumerOptions{})
	if err != nil {
		log.Fatal(err)
	}
	go func() { _ = cons.Run(ctx) }()
}
