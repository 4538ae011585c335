// Command orders is a small order service wired to NATS JetStream through
// the outbox and the inbox (adapters/natsjs):
//
//   - placing an order inserts it into the orders table and enqueues an
//     "order.placed" event into the outbox in the same transaction
//     (EnqueueTx): the event exists if and only if the order does;
//   - a relay (a processor on the outbox with the natsjs BatchPublisher)
//     publishes the events to the ORDERS stream, Nats-Msg-Id = event id;
//   - a stand-in payment service consumes ORDERS and publishes a
//     "payment.captured" per order to the PAYMENTS stream;
//   - the natsjs Consumer moves PAYMENTS into the inbox (idempotency key:
//     Nats-Msg-Id), and a transactional inbox processor (processor.NewTx)
//     books each payment on its order in the transaction that completes
//     the inbox message: the effect is applied exactly once, with no
//     table of applied messages, though booking is not idempotent.
//
// It exits 0 once every order is paid, each with its amount booked once,
// and 1 when a check fails (a payment booked twice or not at all). It
// works in a database of its own, leasestore_orders_<random>, and in
// streams of its own, all removed at the end.
//
//	go run ./orders                  # from examples/; PostgreSQL and NATS on 127.0.0.1
//	go run ./orders -orders 500 -nats-url nats://127.0.0.1:4222
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/leasestore/leasestore/adapters/natsjs"
	"github.com/leasestore/leasestore/db"
	"github.com/leasestore/leasestore/internal/pgadmin"
	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/processor"
)

// config holds the service's settings.
type config struct {
	AdminURL string // PostgreSQL server to create the database on
	NatsURL  string
	Orders   int
	Keep     bool // keep the database
}

func main() {
	var cfg config
	flag.StringVar(&cfg.AdminURL, "database-url", envOr("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"),
		"PostgreSQL server to create the example's database on (a role with CREATEDB)")
	flag.StringVar(&cfg.NatsURL, "nats-url", envOr("NATS_URL", nats.DefaultURL), "NATS server with JetStream")
	flag.IntVar(&cfg.Orders, "orders", 50, "orders to place, 1..10000")
	flag.BoolVar(&cfg.Keep, "keep", false, "keep the database instead of dropping it")
	flag.Parse()
	if cfg.Orders < 1 || cfg.Orders > 10_000 {
		fmt.Fprintln(os.Stderr, "orders: -orders must be 1..10000")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Stdout, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "orders:", err)
		os.Exit(1)
	}
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// relayOptions are the relay's processor options; the ORDERS stream's
// duplicate window is made to cover them (natsjs.RequiredDuplicateWindow).
var relayOptions = processor.Options{
	Owner: "orders-relay", BatchSize: 100, LeaseDuration: 10 * time.Second, PollInterval: 50 * time.Millisecond,
	RetryPolicy: processor.RetryPolicy{MaxAttempts: 20, MaxDelay: time.Minute},
}

// run sets up the database and the streams, places the orders, runs the
// relay, the payment service and the inbox until every order is paid, and
// removes what it created.
func run(ctx context.Context, out io.Writer, cfg config) (err error) {
	suffix := randomHex(4)
	name := "leasestore_orders_" + suffix
	url, err := pgadmin.CreateDatabase(ctx, cfg.AdminURL, name, "")
	if err != nil {
		return fmt.Errorf("create database %s (is PostgreSQL running? `make db-start` starts it): %w", name, err)
	}
	defer func() {
		if cfg.Keep {
			fmt.Fprintf(out, "kept database %s: %s\n", name, url)
		} else if dropErr := pgadmin.DropDatabase(cfg.AdminURL, name); dropErr != nil {
			err = errors.Join(err, dropErr)
		}
	}()
	poolConfig, err := pgxpool.ParseConfig(url)
	if err != nil {
		return err
	}
	// Each running TxHandler holds a connection for its call; the relay,
	// the consumer and the heartbeats need others.
	poolConfig.MaxConns = int32(inboxOptions.Concurrency) + 4
	pool, err := pgxpool.NewWithConfig(ctx, poolConfig)
	if err != nil {
		return err
	}
	defer pool.Close()
	if _, err := db.MigrateUp(ctx, pool); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE orders (id bigint PRIMARY KEY, amount_cents bigint NOT NULL,
		paid_cents bigint NOT NULL DEFAULT 0, status text NOT NULL DEFAULT 'placed')`); err != nil {
		return err
	}

	nc, err := nats.Connect(cfg.NatsURL, nats.MaxReconnects(-1))
	if err != nil {
		return fmt.Errorf("connect to NATS at %s: %w", cfg.NatsURL, err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	ordersStream, paymentsStream := "ORDERS_"+suffix, "PAYMENTS_"+suffix
	ordersSubject, paymentsSubject := "orders_"+suffix+".placed", "payments_"+suffix+".captured"
	for _, s := range []jetstream.StreamConfig{
		{Name: ordersStream, Subjects: []string{ordersSubject}, Duplicates: natsjs.RequiredDuplicateWindow(relayOptions)},
		{Name: paymentsStream, Subjects: []string{paymentsSubject}, Duplicates: 10 * time.Minute},
	} {
		if _, err := js.CreateStream(ctx, s); err != nil {
			return fmt.Errorf("create stream %s: %w", s.Name, err)
		}
		defer func() { err = errors.Join(err, js.DeleteStream(context.WithoutCancel(ctx), s.Name)) }()
	}

	outbox, err := leasing.NewPostgres(pool, leasing.Outbox, leasing.PostgresOptions{})
	if err != nil {
		return err
	}
	inbox, err := leasing.NewPostgres(pool, leasing.Inbox, leasing.PostgresOptions{})
	if err != nil {
		return err
	}

	// Place the orders: the row and its event in one transaction.
	for id := 1; id <= cfg.Orders; id++ {
		if err := placeOrder(ctx, pool, outbox, ordersSubject, int64(id), int64(id)*100); err != nil {
			return err
		}
	}
	fmt.Fprintf(out, "placed %d orders; their events wait in the outbox\n", cfg.Orders)

	// The relay: outbox -> ORDERS.
	pub, err := natsjs.NewPublisher(ctx, nc, natsjs.PublisherOptions{Streams: []string{ordersStream}, Relay: relayOptions})
	if err != nil {
		return err
	}
	relay, err := processor.NewBatch(outbox, processor.BatchPublisher(pub.PublishBatch).Handler(), relayOptions)
	if err != nil {
		return err
	}

	// The inbox: PAYMENTS -> inbox -> book the payment on its order.
	consumer, err := natsjs.NewConsumer(ctx, nc, inbox, natsjs.ConsumerOptions{Stream: paymentsStream, Durable: "orders-inbox"})
	if err != nil {
		return err
	}
	bookPayments, err := processor.NewTx(inbox, bookPayment, inboxOptions)
	if err != nil {
		return err
	}

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, 4)
	for _, r := range []func(context.Context) error{relay.Run, bookPayments.Run, consumer.Run,
		func(ctx context.Context) error { return paymentService(ctx, js, ordersStream, paymentsSubject) }} {
		go func() { errs <- r(runCtx) }()
	}
	start := time.Now()
	paid, waitErr := waitPaid(ctx, pool, cfg.Orders)
	cancel()
	for range 4 {
		err = errors.Join(err, <-errs)
	}
	if waitErr != nil {
		return errors.Join(err, waitErr)
	}
	fmt.Fprintf(out, "relayed %d order events to %s and consumed %d payments through the inbox in %s\n",
		cfg.Orders, ordersStream, paid, time.Since(start).Round(time.Millisecond))

	stats, err := outbox.Stats(ctx)
	if err != nil {
		return err
	}
	info, err := js.Stream(ctx, ordersStream)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "outbox: %d published, %d dead-lettered; %s holds %d messages\n",
		stats.Depth[leasing.StatusPublished], stats.Depth[leasing.StatusDeadLettered], ordersStream, info.CachedInfo().State.Msgs)
	if got := stats.Depth[leasing.StatusPublished]; got != int64(cfg.Orders) {
		return fmt.Errorf("%d events published, want %d", got, cfg.Orders)
	}
	var misbooked int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM orders WHERE paid_cents <> amount_cents`).Scan(&misbooked); err != nil {
		return err
	}
	if misbooked != 0 {
		return fmt.Errorf("%d orders booked a payment other than their amount", misbooked)
	}
	fmt.Fprintln(out, "PASS: every order was placed, announced once and paid once")
	return err
}

// inboxOptions are the inbox processor's options.
var inboxOptions = processor.Options{Owner: "orders-inbox", BatchSize: 100, Concurrency: 4, PollInterval: 50 * time.Millisecond}

// bookPayment is the inbox's TxHandler: it adds the payment to its order
// on tx, which the processor commits with the inbox message's completion.
// The update is not idempotent, and need not be: a payment redelivered by
// NATS is dropped by the inbox (idempotency key), and one whose handler
// ran twice (its lease lost, a crash before the commit) was rolled back
// the first time.
func bookPayment(ctx context.Context, tx pgx.Tx, l leasing.Lease) error {
	var p payment
	if err := json.Unmarshal(l.Message.Payload, &p); err != nil {
		return processor.Permanent(err)
	}
	tag, err := tx.Exec(ctx, `UPDATE orders SET paid_cents = paid_cents + $2, status = 'paid' WHERE id = $1`, p.Order, p.AmountCents)
	if err != nil {
		return err
	}
	if tag.RowsAffected() != 1 {
		return processor.Permanent(fmt.Errorf("payment for unknown order %d", p.Order))
	}
	return nil
}

// placeOrder inserts order id and enqueues its event in one transaction.
func placeOrder(ctx context.Context, pool *pgxpool.Pool, outbox *leasing.Postgres, subject string, id, amount int64) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO orders (id, amount_cents) VALUES ($1, $2)`, id, amount); err != nil {
			return err
		}
		payload, _ := json.Marshal(orderPlaced{Order: id, AmountCents: amount})
		_, err := outbox.EnqueueTx(ctx, tx, leasing.NewMessage{
			Type: "order.placed", Topic: subject, OrderingKey: fmt.Sprintf("order-%d", id), Payload: payload,
		})
		return err
	})
}

type orderPlaced struct {
	Order       int64 `json:"order"`
	AmountCents int64 `json:"amount_cents"`
}

type payment struct {
	Order       int64 `json:"order"`
	AmountCents int64 `json:"amount_cents"`
}

// paymentService stands for another team's service: it consumes the
// order events and publishes one payment per order, deduplicated by the
// PAYMENTS stream on a Nats-Msg-Id derived from the order.
func paymentService(ctx context.Context, js jetstream.JetStream, ordersStream, paymentsSubject string) error {
	cons, err := js.CreateOrUpdateConsumer(ctx, ordersStream, jetstream.ConsumerConfig{Durable: "payments", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		return err
	}
	for ctx.Err() == nil {
		batch, err := cons.Fetch(100, jetstream.FetchMaxWait(200*time.Millisecond))
		if err != nil {
			continue
		}
		for m := range batch.Messages() {
			var o orderPlaced
			if err := json.Unmarshal(m.Data(), &o); err != nil {
				_ = m.Term()
				continue
			}
			body, _ := json.Marshal(payment(o))
			msg := nats.NewMsg(paymentsSubject)
			msg.Data = body
			msg.Header.Set(natsjs.HeaderType, "payment.captured")
			msg.Header.Set(natsjs.HeaderOrderingKey, fmt.Sprintf("order-%d", o.Order))
			if tp := m.Headers().Get("traceparent"); tp != "" {
				msg.Header.Set("traceparent", tp)
			}
			if _, err := js.PublishMsg(ctx, msg, jetstream.WithMsgID(fmt.Sprintf("payment-%d", o.Order))); err != nil {
				_ = m.Nak()
				continue
			}
			_ = m.Ack()
		}
	}
	return nil
}

// waitPaid waits, up to a minute, until n orders are paid.
func waitPaid(ctx context.Context, pool *pgxpool.Pool, n int) (int, error) {
	deadline := time.Now().Add(time.Minute)
	for {
		var paid int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM orders WHERE status = 'paid'`).Scan(&paid); err != nil {
			return paid, err
		}
		if paid == n {
			return paid, nil
		}
		if time.Now().After(deadline) {
			return paid, fmt.Errorf("%d of %d orders paid after a minute", paid, n)
		}
		select {
		case <-ctx.Done():
			return paid, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return strings.ToLower(hex.EncodeToString(b))
}
