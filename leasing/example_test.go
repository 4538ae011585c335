package leasing_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/leasestore/leasestore/leasing"
)

// The transactional outbox: an order and the message announcing it commit
// in one transaction, so that a message is published if and only if its
// order exists. A transaction that rolls back leaves neither.
func ExamplePostgres_EnqueueTx() {
	ctx := context.Background()
	pool := examplePool() // a *pgxpool.Pool on a database migrated with db.MigrateUp
	defer pool.Close()

	// The application's own table.
	if _, err := pool.Exec(ctx, "CREATE TABLE orders (id bigint PRIMARY KEY, item text NOT NULL)"); err != nil {
		log.Fatal(err)
	}
	outbox, err := leasing.NewPostgres(pool, leasing.Outbox, leasing.PostgresOptions{})
	if err != nil {
		log.Fatal(err)
	}

	placeOrder := func(id int64, item string, check func() error) error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "INSERT INTO orders (id, item) VALUES ($1, $2)", id, item); err != nil {
				return err
			}
			msg := leasing.NewMessage{
				Type:    "order.placed",
				Topic:   "orders",
				Payload: fmt.Appendf(nil, `{"id":%d,"item":%q}`, id, item),
			}
			if _, err := outbox.EnqueueTx(ctx, tx, msg); err != nil {
				return err
			}
			return check() // an error here rolls back the order and its message
		})
	}
	accept := func() error { return nil }
	decline := func() error { return errors.New("payment declined") }

	fmt.Println("order 1:", placeOrder(1, "book", accept))
	fmt.Println("order 2:", placeOrder(2, "lamp", decline))

	var orders int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM orders").Scan(&orders); err != nil {
		log.Fatal(err)
	}
	stats, err := outbox.Stats(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("orders:", orders)
	fmt.Println("outbox messages pending:", stats.Depth[leasing.StatusPending])

	// A relay (see processor.Publisher) claims the message and publishes it.
	leases, err := outbox.Claim(ctx, leasing.ClaimRequest{
		Owner: leasing.NewOwner("relay"), BatchSize: 10, LeaseFor: 30 * time.Second,
	})
	if err != nil {
		log.Fatal(err)
	}
	for _, l := range leases {
		fmt.Printf("to publish on %s: %s\n", l.Message.Topic, l.Message.Payload)
	}
	// Output:
	// order 1: <nil>
	// order 2: payment declined
	// orders: 1
	// outbox messages pending: 1
	// to publish on orders: {"id":1,"item":"book"}
}

// A hand-written worker loop: each call completes the previous batch and
// claims the next one in one round trip. A message whose handling fails
// is written as failed with a retry delay, and is due again after it.
func ExamplePostgres_CompleteAndClaim() {
	ctx := context.Background()
	pool := examplePool() // a *pgxpool.Pool on a database migrated with db.MigrateUp
	defer pool.Close()

	inbox, err := leasing.NewPostgres(pool, leasing.Inbox, leasing.PostgresOptions{})
	if err != nil {
		log.Fatal(err)
	}
	var msgs []leasing.NewMessage
	for _, invoice := range []string{"invoice-1", "invoice-2", "invoice-3"} {
		msgs = append(msgs, leasing.NewMessage{Type: "invoice.send", Payload: []byte(invoice)})
	}
	enqueued, err := inbox.Enqueue(ctx, msgs...)
	if err != nil {
		log.Fatal(err)
	}

	// handle stands for the application's work on one message.
	handle := func(l leasing.Lease) error {
		if string(l.Message.Payload) == "invoice-2" {
			return errors.New("mail server unavailable")
		}
		return nil
	}

	claim := leasing.ClaimRequest{Owner: leasing.NewOwner("invoice-worker"), BatchSize: 2, LeaseFor: time.Minute}
	var done []leasing.Lease // handled, to be completed by the next call
	for {
		completed, leases, err := inbox.CompleteAndClaim(ctx, done, claim)
		if err != nil {
			log.Fatal(err)
		}
		if len(completed.Outcomes) > 0 {
			fmt.Println("completed:", completed.Count(leasing.OutcomeApplied))
		}
		if len(leases) == 0 {
			break // nothing due: a long-running worker would wait and claim again
		}
		fmt.Println("claimed:", len(leases))
		done = done[:0]
		for _, l := range leases {
			if err := handle(l); err != nil {
				failed, err := inbox.Fail(ctx, leasing.Failure{Lease: l, RetryAfter: time.Hour, Error: err.Error()})
				if err != nil {
					log.Fatal(err)
				}
				fmt.Printf("%s: failed (%s), due again in an hour\n", l.Message.Payload, failed.Outcomes[0].Outcome)
				continue
			}
			fmt.Printf("%s: handled on attempt %d\n", l.Message.Payload, l.Attempt)
			done = append(done, l)
		}
	}

	row, err := inbox.Get(ctx, enqueued.IDs[1])
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("invoice-2 is %s after %d attempt: %s\n", row.Status, row.AttemptCount, row.LastError)
	// Output:
	// claimed: 2
	// invoice-1: handled on attempt 1
	// invoice-2: failed (applied), due again in an hour
	// completed: 1
	// claimed: 1
	// invoice-3: handled on attempt 1
	// completed: 1
	// invoice-2 is failed after 1 attempt: mail server unavailable
}
