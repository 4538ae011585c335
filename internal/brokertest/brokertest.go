// Package brokertest holds the scenarios every broker adapter's tests run
// against its broker (adapters/natsjs, adapters/rabbitmq, adapters/kafka):
// an outbox relayed and consumed into the inbox, the relay killed with
// SIGKILL and restarted, and the broker cut off by a TCP proxy. Each
// scenario checks what must hold whatever the broker: every message
// reaches the inbox, none is dead-lettered, and the messages of one
// ordering key reach the inbox in enqueue order; a broker that
// deduplicates stores each message once; an outage spends no attempt.
package brokertest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasestore/leasestore/internal/brokermsg"
	"github.com/leasestore/leasestore/internal/dbtest"
	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/processor"
)

// Broker is one adapter under test, with its broker.
type Broker struct {
	// Addr is the broker's host:port; the outage scenario puts a proxy in
	// front of it.
	Addr string
	// Dedups says that the broker stores a message published twice once
	// (JetStream's Nats-Msg-Id): Stored must then count exactly one per
	// message.
	Dedups bool
	// Destination creates a destination of its own for t (stream and
	// subject, queue, topic), deleted when t ends, and returns its name:
	// the outbox topic the relay publishes to.
	Destination func(t testing.TB) string
	// Publisher returns the adapter's batch publisher to dest through
	// addr, for a relay running with relay.
	Publisher func(t testing.TB, addr, dest string, relay processor.Options) processor.BatchPublisher
	// Consume runs the adapter's inbox consumer on dest through addr into
	// inbox until ctx ends.
	Consume func(ctx context.Context, addr, dest string, inbox brokermsg.Enqueuer) error
	// Stored returns how many messages the broker holds on dest; used
	// when Dedups.
	Stored func(t testing.TB, dest string) int
	// BarePublish publishes n small messages to dest with the client
	// library alone, as fast as it goes, and returns once the broker
	// acknowledged them all: the benchmark's yardstick (Bench).
	BarePublish func(tb testing.TB, dest string, n int)
	// Cutter, when not nil, returns the address through which the
	// clients reach the broker in the outage scenario, and the functions
	// that cut it off and restore it. Nil puts a Proxy in front of Addr
	// (a broker whose metadata names its own address, as Kafka's does,
	// needs its own).
	Cutter func(t testing.TB) (addr string, cut, restore func())
}

// Keys is the number of ordering keys the scenarios spread messages over.
const Keys = 25

// relayOptions are the options of the scenarios' relays: a short lease so
// that a killed relay's messages come back soon, and short backoffs. The
// RetryPolicy keeps its default MaxAttempts: an outage must spend no
// attempt (the adapters return processor.Unavailable), so it dead-letters
// nothing whatever its length (Outage checks it).
func relayOptions() processor.Options {
	return processor.Options{
		Owner:         "relay",
		BatchSize:     50,
		Concurrency:   4,
		LeaseDuration: 2 * time.Second,
		PollInterval:  20 * time.Millisecond,
		RetryPolicy:   processor.RetryPolicy{InitialDelay: 50 * time.Millisecond, MaxDelay: 500 * time.Millisecond},
	}
}

// env is one scenario's database, outbox, inbox and destination.
type env struct {
	t      testing.TB
	b      Broker
	url    string
	pool   *pgxpool.Pool
	outbox *leasing.Postgres
	inbox  *leasing.Postgres
	dest   string
	seen   atomic.Int64 // messages the consumer handed to the inbox, redeliveries included
}

func newEnv(t testing.TB, b Broker) *env {
	e := &env{t: t, b: b, url: dbtest.DatabaseURL(t)}
	pool, err := pgxpool.New(t.Context(), e.url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	e.pool = pool
	if e.outbox, err = leasing.NewPostgres(pool, leasing.Outbox, leasing.PostgresOptions{}); err != nil {
		t.Fatal(err)
	}
	if e.inbox, err = leasing.NewPostgres(pool, leasing.Inbox, leasing.PostgresOptions{}); err != nil {
		t.Fatal(err)
	}
	e.dest = b.Destination(t)
	return e
}

// enqueue puts n messages on the outbox, spread over Keys ordering keys,
// with a payload naming the key and its sequence number in the key.
func (e *env) enqueue(n int) { e.enqueueRange(0, n) }

// enqueueRange enqueues the messages from..to-1 of the sequence enqueue
// puts: enqueueRange(0, k) then enqueueRange(k, n) is enqueue(n).
func (e *env) enqueueRange(from, to int) {
	msgs := make([]leasing.NewMessage, 0, to-from)
	for i := from; i < to; i++ {
		key := fmt.Sprintf("k%d", i%Keys)
		msgs = append(msgs, leasing.NewMessage{
			Topic: e.dest, Type: "test.event", OrderingKey: key,
			Payload: fmt.Appendf(nil, `{"key":%q,"seq":%d}`, key, i/Keys),
			Headers: json.RawMessage(`{"traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}`),
		})
	}
	for len(msgs) > 0 {
		k := min(len(msgs), leasing.MaxBatchSize)
		if _, err := e.outbox.Enqueue(e.t.Context(), msgs[:k]...); err != nil {
			e.t.Fatal(err)
		}
		msgs = msgs[k:]
	}
}

// relay runs a relay on the outbox with pub until the returned stop is
// called.
func (e *env) relay(pub processor.BatchPublisher) (stop func()) {
	p, err := processor.NewBatch(e.outbox, pub.Handler(), relayOptions())
	if err != nil {
		e.t.Fatal(err)
	}
	return goRun(e.t, p.Run)
}

// consume runs the consumer through addr until the returned stop is
// called, counting what it hands to the inbox.
func (e *env) consume(addr string) (stop func()) {
	counting := countingInbox{Enqueuer: e.inbox, n: &e.seen}
	return goRun(e.t, func(ctx context.Context) error { return e.b.Consume(ctx, addr, e.dest, counting) })
}

// goRun runs run in a goroutine until the returned stop cancels it and
// waits for it; an error it returns fails t.
func goRun(t testing.TB, run func(context.Context) error) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := run(ctx); err != nil {
			t.Errorf("run: %v", err)
		}
	}()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	return stop
}

type countingInbox struct {
	brokermsg.Enqueuer
	n *atomic.Int64
}

func (c countingInbox) Enqueue(ctx context.Context, msgs ...leasing.NewMessage) (leasing.EnqueueResult, error) {
	res, err := c.Enqueuer.Enqueue(ctx, msgs...)
	if err == nil {
		c.n.Add(int64(len(msgs)))
	}
	return res, err
}

// waitInbox waits, up to a minute, until the inbox holds n messages.
func (e *env) waitInbox(n int) {
	deadline := time.Now().Add(time.Minute)
	for {
		got := e.inboxCount()
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("inbox holds %d of %d messages after a minute; outbox: %v", got, n, e.outboxStatuses())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// inboxCount returns the number of inbox messages, any status.
func (e *env) inboxCount() int {
	n := 0
	for _, d := range e.depth(e.inbox) {
		n += d
	}
	return n
}

// outboxStatuses returns the outbox's depth by status.
func (e *env) outboxStatuses() map[leasing.Status]int { return e.depth(e.outbox) }

func (e *env) depth(store *leasing.Postgres) map[leasing.Status]int {
	stats, err := store.Stats(context.WithoutCancel(e.t.Context()))
	if err != nil {
		e.t.Fatal(err)
	}
	out := make(map[leasing.Status]int, len(stats.Depth))
	for st, n := range stats.Depth {
		if n > 0 {
			out[st] = int(n)
		}
	}
	return out
}

// scanInt returns the one integer row holds.
func (e *env) scanInt(row pgx.Row) int {
	var n int
	if err := row.Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n
}

// check asserts what every scenario ends with: n outbox messages
// published, none dead-lettered; the inbox holds exactly one row per
// outbox message, keyed by the outbox id, with its type, ordering key and
// trace context; each key's rows arrived in enqueue order; a broker that
// dedups stores n messages. It returns the duplicates the consumer
// delivered (dropped by the inbox).
func (e *env) check(n int) (duplicates int) {
	t := e.t
	waitFor(t, func() bool { return e.outboxStatuses()[leasing.StatusPublished] == n })
	if st := e.outboxStatuses(); st[leasing.StatusPublished] != n || st[leasing.StatusDeadLettered] != 0 {
		t.Fatalf("outbox statuses %v, want %d published and none dead-lettered", st, n)
	}
	if got := e.scanInt(e.pool.QueryRow(t.Context(), `SELECT count(*) FROM inbox_messages i JOIN outbox_messages o ON i.idempotency_key = o.message_id::text
		WHERE i.message_type = o.message_type AND i.ordering_key = o.ordering_key
		  AND i.headers->>'traceparent' = o.headers->>'traceparent'`)); got != n {
		t.Fatalf("%d inbox rows match an outbox message by idempotency key, type, ordering key and traceparent; want %d (inbox holds %d)",
			got, n, e.inboxCount())
	}
	if bad := e.scanInt(e.pool.QueryRow(t.Context(), `SELECT count(*) FROM (
		SELECT seq - lag(seq) OVER (PARTITION BY ordering_key ORDER BY key_seq) AS step
		FROM (SELECT ordering_key, key_seq, (convert_from(payload, 'UTF8')::jsonb->>'seq')::int AS seq FROM inbox_messages) r) s
		WHERE step <> 1`)); bad != 0 {
		t.Fatalf("%d inbox rows arrived out of their key's order", bad)
	}
	if e.b.Dedups {
		if got := e.b.Stored(t, e.dest); got != n {
			t.Fatalf("the broker stores %d messages for %d published; want exactly once", got, n)
		}
	}
	dups := int(e.seen.Load()) - n
	t.Logf("%d messages relayed and consumed; the consumer delivered %d duplicates, dropped by the inbox", n, dups)
	return dups
}

// waitFor polls cond for up to a minute.
func waitFor(t testing.TB, cond func() bool) {
	deadline := time.Now().Add(time.Minute)
	for !cond() && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
}

// RoundTrip relays n outbox messages through the adapter's batch
// publisher and consumes them into the inbox, then checks them (see
// check).
func RoundTrip(t testing.TB, b Broker, n int) {
	e := newEnv(t, b)
	e.enqueue(n)
	stopConsumer := e.consume(b.Addr)
	stopRelay := e.relay(b.Publisher(t, b.Addr, e.dest, relayOptions()))
	e.waitInbox(n)
	e.check(n)
	stopRelay()
	stopConsumer()
}

// Outage relays and consumes n messages with the relay and the consumer
// connected through a TCP proxy (or Broker.Cutter). The first half goes
// through; then every connection is cut, and new ones refused, for cut,
// while the second half is enqueued, so that the relay meets the outage
// with messages to publish. No message may be dead-lettered, lost or
// reordered within its key, and the outage may spend no attempt: each
// message was published on its first counted attempt, the attempts the
// outage failed having ended released (see noAttemptSpent).
func Outage(t testing.TB, b Broker, n int, cut time.Duration) {
	e := newEnv(t, b)
	cutter := b.Cutter
	if cutter == nil {
		cutter = func(t testing.TB) (string, func(), func()) {
			proxy := NewProxy(t, b.Addr)
			return proxy.Addr(), proxy.Cut, proxy.Restore
		}
	}
	addr, cutOff, restore := cutter(t)
	stopConsumer := e.consume(addr)
	stopRelay := e.relay(b.Publisher(t, addr, e.dest, relayOptions()))
	e.enqueueRange(0, n/2)
	e.waitInbox(n / 2)
	cutOff()
	e.enqueueRange(n/2, n)
	time.Sleep(cut)
	t.Logf("after %s cut off: outbox %v", cut, e.outboxStatuses())
	restore()
	e.waitInbox(n)
	e.check(n)
	e.noAttemptSpent()
	stopRelay()
	stopConsumer()
}

// noAttemptSpent asserts that every outbox message was published on
// attempt 1: the attempts a broker outage failed were released, which
// gives the attempt back, rather than failed or expired, which spend it.
// It logs how many messages had an attempt released.
func (e *env) noAttemptSpent() {
	t := e.t
	rows, err := e.pool.Query(t.Context(), `SELECT message_id::text, attempt_count, jsonb_path_query_array(attempts, '$[*].outcome')::text FROM outbox_messages
		WHERE attempt_count <> 1 OR jsonb_path_exists(attempts, '$[*] ? (@.outcome != "released" && @.outcome != "published")')
		ORDER BY message_id LIMIT 5`)
	if err != nil {
		t.Fatal(err)
	}
	var bad []string
	for rows.Next() {
		var id, history string
		var count int
		if err := rows.Scan(&id, &count, &history); err != nil {
			t.Fatal(err)
		}
		bad = append(bad, fmt.Sprintf("%s at attempt %d, attempts ended %s", id, count, history))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(bad) > 0 {
		t.Fatalf("the outage spent attempts (want each message published on attempt 1, the others released):\n%s",
			strings.Join(bad, "\n"))
	}
	released := e.scanInt(e.pool.QueryRow(t.Context(),
		`SELECT count(*) FROM outbox_messages WHERE attempts @> '[{"outcome":"released"}]'`))
	t.Logf("every message published on attempt 1; %d had an attempt released by the outage", released)
}

// The environment that tells a test binary started by RelayKilled to run
// the relay (RelayChild).
const (
	envDatabase = "LEASESTORE_BROKERTEST_DATABASE_URL"
	envDest     = "LEASESTORE_BROKERTEST_DEST"
	envAddr     = "LEASESTORE_BROKERTEST_ADDR"
)

// RelayKilled enqueues n messages, starts a relay in a child process (this
// test binary running the test named child, which calls RelayChild), kills
// it with SIGKILL once some messages reached the inbox, and restarts a relay
// in this process; every message must reach the inbox (see check).
func RelayKilled(t testing.TB, b Broker, n int, child string) {
	e := newEnv(t, b)
	e.enqueue(n)
	stopConsumer := e.consume(b.Addr)

	cmd := exec.Command(os.Args[0], "-test.run=^"+child+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), envDatabase+"="+e.url, envDest+"="+e.dest, envAddr+"="+b.Addr)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	e.waitInbox(n / 4)
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	at := e.inboxCount()
	if at >= n {
		t.Fatalf("the child relay published all %d messages before it was killed; output:\n%s", n, out.String())
	}
	t.Logf("relay killed with %d of %d messages in the inbox; outbox: %v", at, n, e.outboxStatuses())

	stopRelay := e.relay(b.Publisher(t, b.Addr, e.dest, relayOptions()))
	e.waitInbox(n)
	e.check(n)
	stopRelay()
	stopConsumer()
}

// RelayChild is the body of the child test RelayKilled starts: it runs a
// relay on the database and destination RelayKilled gave it until killed.
// Outside RelayKilled (its environment unset) it skips.
func RelayChild(t testing.TB, b Broker) {
	url, dest, addr := os.Getenv(envDatabase), os.Getenv(envDest), os.Getenv(envAddr)
	if url == "" {
		t.Skip("runs only as RelayKilled's child process")
	}
	pool, err := pgxpool.New(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	outbox, err := leasing.NewPostgres(pool, leasing.Outbox, leasing.PostgresOptions{})
	if err != nil {
		t.Fatal(err)
	}
	opts := relayOptions()
	opts.Concurrency = 1 // slow enough to be killed mid-run
	opts.BatchSize = 5
	pub := b.Publisher(t, addr, dest, opts)
	// Each call waits after its publish before its outcome is written, so
	// that the kill most likely finds messages published but not marked:
	// the window in which a relay's crash makes it publish them again.
	slow := processor.BatchPublisher(func(ctx context.Context, msgs []leasing.Message) []error {
		errs := pub(ctx, msgs)
		time.Sleep(100 * time.Millisecond)
		return errs
	})
	p, err := processor.NewBatch(outbox, slow.Handler(), opts)
	if err != nil {
		t.Fatal(err)
	}
	_ = p.Run(t.Context()) // until SIGKILL
}

// Name returns a name unique to this test for a broker destination: the
// prefix, the test's name reduced to letters and digits, and random hex.
func Name(t testing.TB, prefix string) string {
	var b strings.Builder
	b.WriteString(prefix)
	for _, r := range t.Name() {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			b.WriteRune(r)
		}
	}
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	return b.String() + "_" + hex.EncodeToString(rnd[:])
}

// Addr returns the broker address the environment variable env holds,
// else local (the local broker .ci/run starts).
func Addr(env, local string) string {
	if a := os.Getenv(env); a != "" {
		return a
	}
	return local
}

// Unreachable ends t because the broker named broker at addr could not be
// reached (err): it skips t, or fails it when the environment has CI=true,
// so that CI never passes by skipping.
func Unreachable(t testing.TB, broker, addr string, err error) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s at %s: %v", broker, addr, err)
	}
	t.Skipf("%s at %s: %v", broker, addr, err)
}

// Verdict returns the verdict err carries (processor.VerdictOf) without
// its delay: VerdictRetry for nil or an error that carries none.
func Verdict(err error) processor.Verdict { v, _ := processor.VerdictOf(err); return v }

// Bench measures, in one run, the relay's throughput with the adapter's
// batch publisher (sub-benchmark "relay": n outbox messages without
// ordering keys, enqueued with the timer stopped, then a relay of
// Concurrency 4 and BatchSize 100 started until all are published) beside
// the client library's own publish loop of n messages (sub-benchmark
// "bare", Broker.BarePublish). Each reports msgs/s.
func Bench(b *testing.B, br Broker, n int) {
	b.Run("bare", func(b *testing.B) {
		dest := br.Destination(b)
		b.ResetTimer()
		for range b.N {
			br.BarePublish(b, dest, n)
		}
		b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "msgs/s")
	})
	b.Run("relay", func(b *testing.B) {
		e := newEnv(b, br)
		opts := relayOptions()
		opts.BatchSize = 100
		pub := br.Publisher(b, br.Addr, e.dest, opts)
		msgs := make([]leasing.NewMessage, n)
		for i := range msgs {
			msgs[i] = leasing.NewMessage{Topic: e.dest, Type: "bench.event", Payload: fmt.Appendf(nil, `{"seq":%d}`, i)}
		}
		b.ResetTimer()
		for i := range b.N {
			b.StopTimer()
			for rest := msgs; len(rest) > 0; {
				k := min(len(rest), leasing.MaxBatchSize)
				if _, err := e.outbox.Enqueue(b.Context(), rest[:k]...); err != nil {
					b.Fatal(err)
				}
				rest = rest[k:]
			}
			b.StartTimer()
			p, err := processor.NewBatch(e.outbox, pub.Handler(), opts)
			if err != nil {
				b.Fatal(err)
			}
			stop := goRun(b, p.Run)
			for e.outboxStatuses()[leasing.StatusPublished] < n*(i+1) {
				time.Sleep(5 * time.Millisecond)
			}
			stop()
		}
		b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "msgs/s")
	})
}
