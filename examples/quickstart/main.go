// Quickstart enqueues an outbox message in the transaction that changes your
// data, then runs a processor that publishes it until Ctrl-C.
package main

import (
	"context"
	"log"
	"os"
	"os/signal"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasestore/leasestore/db"
	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/processor"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	url := os.Getenv("DATABASE_URL") // a database of its own: the quickstart migrates it
	if url == "" {
		log.Fatal("set DATABASE_URL, e.g. postgres://postgres@127.0.0.1:5432/quickstart")
	}
	pool, err := pgxpool.New(ctx, url)
	check(err)
	_, err = db.MigrateUp(ctx, pool) // in production, run migrations from CI instead
	check(err)
	outbox, err := leasing.NewPostgres(pool, leasing.Outbox, leasing.PostgresOptions{})
	check(err)

	// The transactional outbox: the message commits with your change, or neither does.
	check(pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// ... your INSERT or UPDATE on tx ...
		_, err := outbox.EnqueueTx(ctx, tx, leasing.NewMessage{Topic: "orders", Payload: []byte(`{"order":42}`)})
		return err
	}))

	// Claim due messages, renew their leases while publish runs, write each outcome.
	p, err := processor.New(outbox, publish, processor.Options{Owner: "relay"})
	check(err)
	check(p.Run(ctx)) // until Ctrl-C, then a graceful shutdown
}

// publish hands one message to your broker. An error is retried with backoff.
func publish(ctx context.Context, lease leasing.Lease) error {
	log.Printf("publish %s to %q: %s", lease.Message.ID, lease.Message.Topic, lease.Message.Payload)
	return nil
}

func check(err error) {
	if err != nil {
		log.Fatal(err)
	}
}
