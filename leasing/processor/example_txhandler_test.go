package processor_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/processor"
)

// A payments consumer on the transactional inbox: the handler books the
// payment in the transaction the processor gives it, and the message's
// completion commits in the same transaction. A payment is booked once
// per message, with no table of applied messages: a crash, a lost reply
// or a lost lease rolls the booking back with the completion, and the
// message is handled again.
func ExampleNewTx() {
	ctx := context.Background()
	pool := examplePool() // a *pgxpool.Pool on a database migrated with db.MigrateUp
	defer pool.Close()
	if _, err := pool.Exec(ctx, `CREATE TABLE payments (order_id bigint NOT NULL, cents bigint NOT NULL)`); err != nil {
		log.Fatal(err)
	}

	inbox, err := leasing.NewPostgres(pool, leasing.Inbox, leasing.PostgresOptions{})
	if err != nil {
		log.Fatal(err)
	}
	// The idempotency key drops a redelivery by the sender at the door.
	enqueued, err := inbox.Enqueue(ctx, leasing.NewMessage{
		Type: "payment.captured", Payload: []byte(`{"order":7,"cents":1250}`), IdempotencyKey: "capture-7",
	})
	if err != nil {
		log.Fatal(err)
	}

	book := func(ctx context.Context, tx pgx.Tx, lease leasing.Lease) error {
		var p struct{ Order, Cents int64 }
		if err := json.Unmarshal(lease.Message.Payload, &p); err != nil {
			return processor.Permanent(err) // no retry can fix the payload
		}
		if _, err := tx.Exec(ctx, `INSERT INTO payments (order_id, cents) VALUES ($1, $2)`, p.Order, p.Cents); err != nil {
			return err
		}
		return nil // the processor completes the message in tx and commits
	}

	// Each running handler holds a pool connection; the pool (pgxpool's
	// default: 4 here) must have more than Concurrency.
	p, err := processor.NewTx(inbox, book, processor.Options{Owner: "payments", Concurrency: 2})
	if err != nil {
		log.Fatal(err)
	}
	ran := make(chan error, 1)
	go func() { ran <- p.Run(ctx) }()

	row := waitCompleted(ctx, inbox, enqueued.IDs[0])
	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := p.Stop(stopCtx); err != nil {
		log.Fatal(err)
	}
	if err := <-ran; err != nil {
		log.Fatal(err)
	}

	var n, cents int64
	if err := pool.QueryRow(ctx, `SELECT count(*), sum(cents) FROM payments`).Scan(&n, &cents); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%d payment of %d cents booked; message %s\n", n, cents, row.Status)
	// Output:
	// 1 payment of 1250 cents booked; message completed
}

// waitCompleted returns the row of id once its status is completed, and
// ends the program when that takes more than 10 seconds.
func waitCompleted(ctx context.Context, store leasing.Store, id uuid.UUID) leasing.Row {
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		row, err := store.Get(ctx, id)
		if err != nil {
			log.Fatal(err)
		}
		if row.Status == leasing.StatusCompleted {
			return row
		}
		time.Sleep(10 * time.Millisecond)
	}
	log.Fatalf("message %s not completed in time", id)
	return leasing.Row{}
}
