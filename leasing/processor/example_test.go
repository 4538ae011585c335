package processor_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"
	"time"

	"go.opentelemetry.io/otel/metric/noop"

	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/processor"
)

// An inbox processor whose handler fails the first attempt: the message is
// written as failed, claimed again after the retry delay and handled on
// the second attempt.
func Example() {
	ctx := context.Background()
	pool := examplePool() // a *pgxpool.Pool on a database migrated with db.MigrateUp
	defer pool.Close()

	inbox, err := leasing.NewPostgres(pool, leasing.Inbox, leasing.PostgresOptions{})
	if err != nil {
		log.Fatal(err)
	}
	enqueued, err := inbox.Enqueue(ctx, leasing.NewMessage{Type: "user.signed_up", Payload: []byte(`{"user":42}`)})
	if err != nil {
		log.Fatal(err)
	}

	handled := make(chan struct{})
	handler := func(ctx context.Context, lease leasing.Lease) error {
		if lease.Attempt == 1 {
			fmt.Println("attempt 1: failing")
			return errors.New("welcome mail not sent: SMTP timeout")
		}
		fmt.Printf("attempt %d: handled %s after %q\n", lease.Attempt, lease.Message.Payload, lease.LastError)
		close(handled)
		return nil
	}

	p, err := processor.New(inbox, handler, processor.Options{
		Owner:       "signup-worker",
		RetryPolicy: processor.RetryPolicy{InitialDelay: 50 * time.Millisecond, MaxAttempts: 3},
		// The counters (leases_acquired, succeeded, failed, ...) go to this
		// meter. A program passes the meter of its OpenTelemetry SDK
		// MeterProvider, the one its exporter (Prometheus, OTLP) reads,
		// e.g. otel.Meter("signup-worker") after otel.SetMeterProvider.
		Meter: noop.NewMeterProvider().Meter("signup-worker"),
	})
	if err != nil {
		log.Fatal(err)
	}
	ran := make(chan error, 1)
	go func() { ran <- p.Run(ctx) }()

	<-handled
	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := p.Stop(stopCtx); err != nil {
		log.Fatal(err)
	}
	if err := <-ran; err != nil {
		log.Fatal(err)
	}

	row, err := inbox.Get(ctx, enqueued.IDs[0])
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(row.Status, "after", row.AttemptCount, "attempts")
	// Output:
	// attempt 1: failing
	// attempt 2: handled {"user":42} after "welcome mail not sent: SMTP timeout"
	// completed after 2 attempts
}

// Graceful shutdown on SIGINT or SIGTERM. The processor holds three
// leases, one with a running handler. On the signal, the two leases whose
// handler has not started are released at once: due again, their attempt
// returned. The running handler gets ShutdownGrace to finish; then its
// context is cancelled with cause ErrShutdown, and the error it returns is
// written as failed, due again at once, after ErrShutdown's text.
func ExampleProcessor_Stop() {
	ctx := context.Background()
	pool := examplePool() // a *pgxpool.Pool on a database migrated with db.MigrateUp
	defer pool.Close()

	inbox, err := leasing.NewPostgres(pool, leasing.Inbox, leasing.PostgresOptions{})
	if err != nil {
		log.Fatal(err)
	}
	enqueued, err := inbox.Enqueue(ctx,
		leasing.NewMessage{Payload: []byte("report-1")},
		leasing.NewMessage{Payload: []byte("report-2")},
		leasing.NewMessage{Payload: []byte("report-3")},
	)
	if err != nil {
		log.Fatal(err)
	}

	started := make(chan struct{})
	handler := func(ctx context.Context, lease leasing.Lease) error {
		fmt.Printf("%s: started\n", lease.Message.Payload)
		close(started)
		<-ctx.Done() // a long job that stops when its context ends
		fmt.Printf("%s: stopped, cause: %v\n", lease.Message.Payload, context.Cause(ctx))
		return ctx.Err()
	}
	p, err := processor.New(inbox, handler, processor.Options{
		Concurrency:   1,
		BatchSize:     3,
		ShutdownGrace: 100 * time.Millisecond,
	})
	if err != nil {
		log.Fatal(err)
	}

	sigCtx, stopSignals := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stopSignals()
	ran := make(chan error, 1)
	go func() { ran <- p.Run(sigCtx) }()

	<-started
	// Here the example interrupts itself, as Ctrl-C or a SIGTERM from the
	// service manager would.
	if err := syscall.Kill(os.Getpid(), syscall.SIGINT); err != nil {
		log.Fatal(err)
	}
	<-sigCtx.Done()
	// The signal started the shutdown; Stop waits for it, up to a deadline.
	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := p.Stop(stopCtx); err != nil {
		log.Fatal("shutdown did not finish: ", err)
	}
	if err := <-ran; err != nil {
		log.Fatal(err)
	}

	for _, id := range enqueued.IDs {
		row, err := inbox.Get(ctx, id)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%s: %s, attempts %d", row.Payload, row.Status, row.AttemptCount)
		if row.LastError != "" {
			fmt.Printf(", last error %q", row.LastError)
		}
		fmt.Println()
	}
	// Output:
	// report-1: started
	// report-1: stopped, cause: processor: shut down
	// report-1: failed, attempts 1, last error "processor: shut down: context canceled"
	// report-2: pending, attempts 0
	// report-3: pending, attempts 0
}
