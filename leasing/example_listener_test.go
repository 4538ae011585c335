package leasing_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/leasestore/leasestore/leasing"
)

// A Listener on the URL of the primary, or on a multi-host URL with
// target_session_attrs=read-write (docs/high-availability.md), with a
// heartbeat: a connection silent for HeartbeatInterval is probed, and one
// that does not answer within HeartbeatTimeout is replaced. Healthy
// reports whether it listens and was heard from within that bound; a
// health check can serve it. Store calls during a failover fail with an
// error matching ErrUnavailable.
func ExampleListener_Healthy() {
	ctx, cancel := context.WithCancel(context.Background())
	pool := examplePool() // a *pgxpool.Pool on a database migrated with db.MigrateUp
	defer pool.Close()

	l, err := leasing.NewListener(pool.Config().ConnConfig, leasing.Inbox, leasing.ListenerOptions{
		HeartbeatInterval: 5 * time.Second,
		HeartbeatTimeout:  2 * time.Second,
	})
	if err != nil {
		log.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	<-l.Wake() // the wake after each LISTEN
	fmt.Println("listening:", l.Healthy())

	store, err := leasing.NewPostgres(pool, leasing.Inbox, leasing.PostgresOptions{})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := store.Enqueue(ctx, leasing.NewMessage{Type: "greeting"}); errors.Is(err, leasing.ErrUnavailable) {
		fmt.Println("no writable primary; retry after a pause")
	}
	<-l.Wake()
	fmt.Println("woken by the enqueue")

	cancel()
	fmt.Println(<-done, l.Healthy())
	// Output:
	// listening: true
	// woken by the enqueue
	// <nil> false
}
