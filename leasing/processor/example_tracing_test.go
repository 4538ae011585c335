package processor_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/processor"
)

// Tracing from enqueue to outcome: the producer's store keeps the trace
// context of the enqueue in the message's headers, and the processor
// starts a span per attempt, linked to it, that the handler's context
// carries.
func Example_tracing() {
	ctx := context.Background()
	pool := examplePool() // a *pgxpool.Pool on a database migrated with db.MigrateUp
	defer pool.Close()

	// A program passes the TracerProvider of its OpenTelemetry SDK
	// (go.opentelemetry.io/otel/sdk/trace), the one its exporter reads, to
	// the store and to the processor. The API's no-op provider keeps this
	// example free of the SDK: its spans are the caller's.
	var tp trace.TracerProvider = noop.NewTracerProvider()
	outbox, err := leasing.NewPostgres(pool, leasing.Outbox, leasing.PostgresOptions{TracerProvider: tp})
	if err != nil {
		log.Fatal(err)
	}

	// The caller's span, here the one of an incoming request whose W3C
	// traceparent was 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01.
	request := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    trace.TraceID{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36},
		SpanID:     trace.SpanID{0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7},
		TraceFlags: trace.FlagsSampled,
		Remote:     true,
	})
	ctx = trace.ContextWithRemoteSpanContext(ctx, request)
	res, err := outbox.Enqueue(ctx, leasing.NewMessage{Topic: "orders", Payload: []byte(`{"order":7}`)})
	if err != nil {
		log.Fatal(err)
	}
	row, err := outbox.Get(ctx, res.IDs[0])
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("headers:", string(row.Headers))

	published := make(chan struct{})
	publish := processor.Publisher(func(ctx context.Context, msg leasing.Message) error {
		// ctx carries this attempt's "process outbox" span, linked to
		// msg.SpanContext(): start the broker client's span from ctx.
		fmt.Println("publish, enqueued in trace", msg.SpanContext().TraceID())
		close(published)
		return nil
	})
	relay, err := processor.New(outbox, publish.Handler(), processor.Options{Owner: "relay", TracerProvider: tp})
	if err != nil {
		log.Fatal(err)
	}
	ran := make(chan error, 1)
	go func() { ran <- relay.Run(context.Background()) }()

	<-published
	stopCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := relay.Stop(stopCtx); err != nil {
		log.Fatal(err)
	}
	if err := <-ran; err != nil {
		log.Fatal(err)
	}
	// Output:
	// headers: {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
	// publish, enqueued in trace 4bf92f3577b34da6a3ce929d0e0e4736
}
