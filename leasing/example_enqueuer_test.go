package leasing_test

import (
	"context"
	"fmt"
	"log"

	"github.com/leasestore/leasestore/leasing"
)

// announceSignup is producer code: it enqueues in whatever transaction its
// caller runs, through a leasing.Enqueuer. In production the caller passes
// outbox.InTx(tx) inside pgx.BeginFunc, beside its own writes in tx; its
// unit tests pass a Memory transaction.
func announceSignup(ctx context.Context, q leasing.Enqueuer, user int) error {
	_, err := q.Enqueue(ctx, leasing.NewMessage{Type: "user.signed_up", Topic: "users", Payload: fmt.Appendf(nil, `{"user":%d}`, user)})
	return err
}

// A producer unit-tested without PostgreSQL: the messages it enqueues in a
// Memory transaction appear in the store when the transaction commits, and
// never when it rolls back.
func ExampleMemory_Begin() {
	ctx := context.Background()
	outbox, err := leasing.NewMemory(leasing.Outbox, leasing.MemoryOptions{})
	if err != nil {
		log.Fatal(err)
	}
	pending := func() int64 {
		st, err := outbox.Stats(ctx)
		if err != nil {
			log.Fatal(err)
		}
		return st.Depth[leasing.StatusPending]
	}

	tx := outbox.Begin()
	if err := announceSignup(ctx, tx, 42); err != nil {
		log.Fatal(err)
	}
	fmt.Println("before commit:", pending())
	if err := tx.Commit(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("after commit:", pending())

	tx = outbox.Begin()
	if err := announceSignup(ctx, tx, 43); err != nil {
		log.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("after a rollback:", pending())
	// Output:
	// before commit: 0
	// after commit: 1
	// after a rollback: 1
}
