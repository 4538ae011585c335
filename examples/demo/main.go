// Command demo runs the seed's concrete example on a real PostgreSQL: two
// processor instances start at the same moment on the inbox and on the
// outbox, each claiming batches of 10. PostgreSQL skips the rows the other
// instance holds locked, so each instance gets a separate subset.
//
// Along the way it shows the parts a production setup uses: goose
// migrations (db.MigrateUp), a Listener per processor as work signal
// (LISTEN/NOTIFY), the heartbeat keeping a message that runs longer than its
// lease, a retry after a failed first delivery, OpenTelemetry counters,
// histograms and queue depth gauges, the trace of one message from its
// enqueue to its outcome (trace.go), and ordering keys (ordering.go): a
// keyed queue keeps each key's order while a key's head fails and retries,
// and a broker outage (outage.go): the relay's handler says Unavailable,
// the breaker stops the claims and probes, and once the broker is back
// every event is published in order, none dead-lettered. It exits 1 when
// a check fails.
//
// It works in a database of its own, leasestore_demo_<random>, created on
// the server of -database-url (default $DATABASE_URL, else the local
// server) and dropped at the end unless -keep is given.
//
//	go run ./demo                         # from examples/, or: make demo
//	go run ./demo -messages 1000 -keep
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/leasestore/leasestore/db"
	"github.com/leasestore/leasestore/internal/pgadmin"
	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/processor"
)

// workTime is how long the demo's handler works on an ordinary message.
const workTime = 10 * time.Millisecond

// config holds the demo's settings.
type config struct {
	AdminURL string        // server to create the demo database on
	Messages int           // per queue, enqueued before the processors start
	Batch    int           // claim batch size of each processor
	Lease    time.Duration // lease duration; the slow message takes longer
	Keep     bool          // keep the demo database
}

func main() {
	cfg := config{Lease: 2 * time.Second}
	flag.StringVar(&cfg.AdminURL, "database-url", envOr("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"),
		"PostgreSQL server to create the demo database on (a role with CREATEDB)")
	flag.IntVar(&cfg.Messages, "messages", 100, "messages per queue, 10..100000")
	flag.IntVar(&cfg.Batch, "batch", 10, "claim batch size of each processor")
	flag.BoolVar(&cfg.Keep, "keep", false, "keep the demo database instead of dropping it")
	flag.Parse()
	if cfg.Messages < 10 || cfg.Messages > 100_000 {
		fmt.Fprintln(os.Stderr, "demo: -messages must be 10..100000")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Stdout, cfg); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

// run creates and migrates the demo database, runs both queues, prints
// the result and drops the database.
func run(ctx context.Context, out io.Writer, cfg config) error {
	name := "leasestore_demo_" + randomHex(6)
	url, err := pgadmin.CreateDatabase(ctx, cfg.AdminURL, name, "")
	if err != nil {
		return fmt.Errorf("create database %s (is PostgreSQL running? `make db-start` starts it): %w", name, err)
	}
	fmt.Fprintf(out, "created database %s\n", name)
	defer func() {
		if cfg.Keep {
			fmt.Fprintf(out, "kept database %s: %s\n", name, url)
		} else if err := pgadmin.DropDatabase(cfg.AdminURL, name); err != nil {
			fmt.Fprintf(out, "drop database %s: %v\n", name, err)
		}
	}()

	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return err
	}
	defer pool.Close()
	if _, err := db.MigrateUp(ctx, pool); err != nil {
		return err
	}

	reader := sdkmetric.NewManualReader()
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer func() { _ = provider.Shutdown(context.Background()) }()

	inbox, err := leasing.NewPostgres(pool, leasing.Inbox, leasing.PostgresOptions{})
	if err != nil {
		return err
	}
	outbox, err := leasing.NewPostgres(pool, leasing.Outbox, leasing.PostgresOptions{})
	if err != nil {
		return err
	}
	// litebus.<queue>.queue.depth and friends, read from Stats at each collection.
	gauges, err := processor.RegisterQueueGauges(provider.Meter("demo"), inbox, outbox)
	if err != nil {
		return err
	}
	defer func() { _ = gauges.Unregister() }()

	var failed []string
	for _, store := range []*leasing.Postgres{inbox, outbox} {
		problems, err := runQueue(ctx, out, pool, store, cfg, provider)
		if err != nil {
			return err
		}
		failed = append(failed, problems...)
	}

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		return err
	}
	fmt.Fprintln(out, "\nOpenTelemetry instruments (manual reader):")
	printMetrics(out, rm)
	printHistograms(out, rm)
	if err := printTrace(ctx, out, pool); err != nil {
		return err
	}

	if problems, err := runOrdering(ctx, out, pool, cfg); err != nil || len(problems) > 0 {
		return errors.Join(err, errors.New(fmt.Sprint("ordering keys: ", problems)))
	}
	if problems, err := runOutage(ctx, out, pool, cfg); err != nil || len(problems) > 0 {
		return errors.Join(err, errors.New(fmt.Sprint("broker outage: ", problems)))
	}

	if len(failed) > 0 {
		for _, p := range failed {
			fmt.Fprintln(out, "FAIL:", p)
		}
		return errors.New("checks failed")
	}
	fmt.Fprintln(out, "\nPASS: the instances claimed disjoint subsets and every message finished")
	return nil
}

// delivery is one handler call the demo saw.
type delivery struct {
	instance string
	attempt  int
}

// queueRun is what the handlers of one queue saw.
type queueRun struct {
	mu         sync.Mutex
	deliveries map[uuid.UUID][]delivery
}

func (r *queueRun) record(id uuid.UUID, instance string, attempt int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.deliveries[id] = append(r.deliveries[id], delivery{instance, attempt})
}

// runQueue enqueues cfg.Messages messages on the store's queue, runs two
// processor instances on it until every message is finished, and returns
// the checks that failed.
func runQueue(ctx context.Context, out io.Writer, pool *pgxpool.Pool, store *leasing.Postgres, cfg config, provider *sdkmetric.MeterProvider) ([]string, error) {
	q := store.Queue()
	msgs := make([]leasing.NewMessage, cfg.Messages)
	for i := range msgs {
		msgs[i] = leasing.NewMessage{Type: "order_placed", Payload: fmt.Appendf(nil, `{"order":%d}`, i+1)}
		if q == leasing.Outbox {
			msgs[i].Type, msgs[i].Topic = "order_confirmed", "orders"
		}
	}
	res, err := store.Enqueue(ctx, msgs...)
	if err != nil {
		return nil, err
	}
	// The third message fails on its first delivery and is retried; the
	// fifth runs longer than its lease and is kept by the heartbeat (and
	// within the default HandlerTimeout of one minute, past which it would
	// be failed).
	failOnce, slow := res.IDs[2], res.IDs[4]
	fmt.Fprintf(out, "\n%s: enqueued %d messages; one fails once, one runs %s on a %s lease\n",
		q, len(res.IDs), cfg.Lease+cfg.Lease/2, cfg.Lease)

	seen := &queueRun{deliveries: map[uuid.UUID][]delivery{}}
	handler := func(instance string) processor.Handler {
		return func(ctx context.Context, l leasing.Lease) error {
			seen.record(l.Message.ID, instance, l.Attempt)
			switch {
			case l.Message.ID == failOnce && l.Attempt == 1:
				return errors.New("simulated failure of the first delivery")
			case l.Message.ID == slow:
				select {
				case <-time.After(cfg.Lease + cfg.Lease/2):
				case <-ctx.Done():
					return context.Cause(ctx)
				}
			default:
				// Simulated work: without it the instance that claims
				// first can finish every message before the other's
				// first claim on a busy machine.
				select {
				case <-time.After(workTime):
				case <-ctx.Done():
					return context.Cause(ctx)
				}
			}
			return nil
		}
	}

	runCtx, stopAll := context.WithCancel(ctx)
	defer stopAll()
	var wg sync.WaitGroup
	var procs []*processor.Processor
	var reportedMu sync.Mutex
	var reported []error
	onError := func(err error) { reportedMu.Lock(); reported = append(reported, err); reportedMu.Unlock() }
	for _, instance := range []string{"A", "B"} {
		listener, err := leasing.NewListener(pool.Config().ConnConfig, q, leasing.ListenerOptions{OnError: onError})
		if err != nil {
			return nil, err
		}
		p, err := processor.New(store, handler(instance), processor.Options{
			Owner:         "demo-" + instance,
			BatchSize:     cfg.Batch,
			LeaseDuration: cfg.Lease,
			Concurrency:   4,
			RetryPolicy:   processor.RetryPolicy{InitialDelay: 100 * time.Millisecond},
			Meter:         provider.Meter("demo/" + instance),
			WorkSignal:    listener,
			OnError:       onError,
		})
		if err != nil {
			return nil, err
		}
		procs = append(procs, p)
		wg.Go(func() { _ = listener.Run(runCtx) })
	}
	start := make(chan struct{})
	for _, p := range procs {
		wg.Go(func() {
			<-start
			_ = p.Run(runCtx)
		})
	}
	began := time.Now()
	close(start) // both instances start at the same moment

	done, err := waitFinished(ctx, store, len(res.IDs), time.Minute)
	stopAll()
	wg.Wait()
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(out, "%s: %d of %d finished in %s\n", q, done, len(res.IDs), time.Since(began).Round(time.Millisecond))
	return check(ctx, out, store, res.IDs, seen, failOnce, slow, reported), nil
}

// waitFinished polls Stats until n messages are in the queue's success
// state or within is over, and returns how many are.
func waitFinished(ctx context.Context, store *leasing.Postgres, n int, within time.Duration) (int, error) {
	deadline := time.Now().Add(within)
	for {
		st, err := store.Stats(ctx)
		if err != nil {
			return 0, err
		}
		done := int(st.Depth[store.Queue().Succeeded()])
		if done == n || time.Now().After(deadline) {
			return done, nil
		}
		select {
		case <-ctx.Done():
			return done, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// check prints what each instance handled and returns the checks that
// failed: every message finished; each first delivery went to one instance
// only; the failing message was retried; the slow one ran once.
func check(ctx context.Context, out io.Writer, store *leasing.Postgres, ids []uuid.UUID, seen *queueRun, failOnce, slow uuid.UUID, reported []error) []string {
	q := store.Queue()
	var problems []string
	firsts := map[string]int{}
	for _, id := range ids {
		row, err := store.Get(ctx, id)
		if err != nil || row.Status != q.Succeeded() {
			problems = append(problems, fmt.Sprintf("%s message %s is %s, want %s", q, id, row.Status, q.Succeeded()))
		}
		ds := seen.deliveries[id]
		attempt1 := 0
		for _, d := range ds {
			if d.attempt == 1 {
				attempt1++
				firsts[d.instance]++
			}
		}
		want := 1
		if id == failOnce {
			want = 2
		}
		if len(ds) != want || attempt1 != 1 {
			problems = append(problems, fmt.Sprintf("%s message %s had deliveries %v, want %d with one first attempt", q, id, ds, want))
		}
	}
	fmt.Fprintf(out, "%s: first deliveries per instance: A %d, B %d (disjoint: each message's first delivery went to one instance)\n",
		q, firsts["A"], firsts["B"])
	fmt.Fprintf(out, "%s: message %s failed once and was retried (attempts %v)\n", q, failOnce, seen.deliveries[failOnce])
	fmt.Fprintf(out, "%s: message %s outlived its lease by the heartbeat's renewals and ran once\n", q, slow)
	if firsts["A"] == 0 || firsts["B"] == 0 {
		problems = append(problems, fmt.Sprintf("%s: one instance claimed nothing (A %d, B %d)", q, firsts["A"], firsts["B"]))
	}
	for _, err := range reported {
		fmt.Fprintf(out, "%s: reported and retried: %v\n", q, err)
	}
	return problems
}

// printMetrics prints every counter and gauge data point, by name.
func printMetrics(out io.Writer, rm metricdata.ResourceMetrics) {
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch data := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, dp := range data.DataPoints {
					fmt.Fprintf(out, "  %-44s %-13s %6d\n", m.Name, sm.Scope.Name, dp.Value)
				}
			case metricdata.Gauge[int64]:
				for _, dp := range data.DataPoints {
					status, _ := dp.Attributes.Value("status")
					fmt.Fprintf(out, "  %-44s %-13s %6d\n", m.Name, status.AsString(), dp.Value)
				}
			}
		}
	}
}

func envOr(name, fallback string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return fallback
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // crypto/rand.Read never fails on supported platforms
	return hex.EncodeToString(b)
}
