package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
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

// errDemoFailed is returned when a demo check fails; the details are printed.
var errDemoFailed = errors.New("demo checks failed (see FAIL lines above)")

// Processor settings of the demo.
const (
	demoLease       = 2 * time.Second
	demoHeartbeat   = 500 * time.Millisecond
	demoPoll        = time.Second
	demoConcurrency = 4
	demoRetryDelay  = 100 * time.Millisecond
	// demoDeadline bounds the wait for the queues to drain.
	demoDeadline = time.Minute
	// demoStatsEvery is how often the demo reads Stats to see whether a
	// queue has drained.
	demoStatsEvery = 20 * time.Millisecond
)

// demoConfig holds the demo's flags.
type demoConfig struct {
	Messages   int           // backlog per queue, enqueued before the processors start
	Late       int           // per queue, enqueued once the backlog is done
	Batch      int           // claim batch size
	Fail       int           // per queue, messages whose first delivery fails
	HandleTime time.Duration // per delivery
	SlowTime   time.Duration // handling time of one slow message per queue; 0 for none
}

// runDemo is "leasectl demo": the seed's concrete example with real
// processors. Two processor instances start at the same moment on each
// queue with batch size 10; PostgreSQL skips the rows the other holds
// locked, so each gets a separate subset.
func runDemo(ctx context.Context, c *cli, args []string) error {
	fs := c.newFlagSet("demo", "[--keep] [--messages N] [--late N] [--batch N] [--fail N]\n"+
		"       [--handle-time D] [--slow-time D] [--throwaway auto|always|never]\n\n"+
		"Creates its own database leasestore_demo_<random> on the server (it never\n"+
		"touches other databases), migrates it and enqueues messages on the inbox and\n"+
		"the outbox. Two instances, each with one processor.Processor per queue, start\n"+
		"at the same moment; each processor renews its leases with a heartbeat, is\n"+
		"woken by LISTEN/NOTIFY and records OpenTelemetry counters. A few messages\n"+
		"fail once and are retried; one is slower than the lease, kept alive by the\n"+
		"heartbeat; more messages arrive once the backlog is done. The demo stops\n"+
		"each queue's processors once it has drained, checks that the instances\n"+
		"handled disjoint subsets and that every message finished, prints the\n"+
		"counters and the queue depth gauges, and drops the database.")
	keep := fs.Bool("keep", false, "keep the demo database instead of dropping it")
	messages := fs.Int("messages", 100, "messages to enqueue on each queue before the processors start")
	late := fs.Int("late", 10, "messages to enqueue on each queue once the backlog is done")
	batch := fs.Int("batch", 10, "claim batch size of each processor")
	fail := fs.Int("fail", 3, "messages on each queue whose first delivery fails")
	handleTime := fs.Duration("handle-time", 2*time.Millisecond, "simulated handling time per message")
	slowTime := fs.Duration("slow-time", 2500*time.Millisecond, "handling time of one slow message per queue (0: none)")
	throwaway := fs.String("throwaway", "auto", "start a throwaway PostgreSQL from the installed server binaries:\n"+
		"auto: when none answers at the default URL; always; never")
	if err := c.parse(fs, args); err != nil {
		return err
	}
	failSet := false
	fs.Visit(func(f *flag.Flag) { failSet = failSet || f.Name == "fail" })
	if !failSet {
		*fail = min(*fail, *messages-1) // the default adapts to a short backlog
	}
	switch {
	case *messages < 1 || *messages > 1_000_000:
		return usagef("--messages must be 1..1000000, got %d", *messages)
	case *late < 0 || *late > leasing.MaxBatchSize:
		return usagef("--late must be 0..%d, got %d", leasing.MaxBatchSize, *late)
	case *batch < 1 || *batch > leasing.MaxBatchSize:
		return usagef("--batch must be 1..%d, got %d", leasing.MaxBatchSize, *batch)
	case *fail < 0 || *fail >= *messages:
		return usagef("--fail must be 0..%d (less than --messages), got %d", *messages-1, *fail)
	case *handleTime < 0 || *handleTime > time.Second:
		return usagef("--handle-time must be 0..1s, got %s", *handleTime)
	case *slowTime < 0 || *slowTime > 30*time.Second:
		return usagef("--slow-time must be 0..30s, got %s", *slowTime)
	case *throwaway != "auto" && *throwaway != "always" && *throwaway != "never":
		return usagef("--throwaway must be auto, always or never, got %q", *throwaway)
	}
	if _, err := c.poolConfig(); err != nil {
		return err
	}

	out := c.stdout
	fmt.Fprintln(out, "leasectl demo: two processor instances claim from the same queues at the same moment")
	server, err := c.demoServer(ctx, *throwaway)
	if err != nil {
		return err
	}
	defer server.stop()
	admin := server.url
	keepDB := *keep && !server.throwaway
	if *keep && server.throwaway {
		fmt.Fprintln(out, "note: --keep has no effect on a throwaway server, which is removed at exit")
	}

	name := "leasestore_demo_" + randomHex(6)
	demoURL, err := createDemoDatabase(ctx, admin, name)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "created database %s\n", name)
	defer func() {
		if keepDB {
			fmt.Fprintf(out, "kept database %s; look at it with:\n  leasectl --database-url '%s' stats\n", name, demoURL)
			return
		}
		if err := dropDemoDatabase(admin, name); err != nil {
			fmt.Fprintf(c.stderr, "leasectl demo: drop database %s: %v\n", name, err)
			return
		}
		fmt.Fprintf(out, "dropped database %s\n", name)
	}()

	cfg, err := pgxpool.ParseConfig(demoURL)
	if err != nil {
		return err
	}
	// Four processors, each with up to one claim, one renew and one write
	// at a time, the drain checks and the gauges.
	cfg.MaxConns = 16
	cfg.ConnConfig.RuntimeParams["application_name"] = "leasectl demo"
	pool, err := openPool(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	versions, err := db.MigrateUp(ctx, pool)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "migrated: %d migrations applied\n", len(versions))
	return demoRun(ctx, out, pool, demoConfig{
		Messages: *messages, Late: *late, Batch: *batch, Fail: *fail, HandleTime: *handleTime, SlowTime: *slowTime,
	})
}

// createDemoDatabase creates database name through the admin connection
// string and returns the connection string of the new database.
func createDemoDatabase(ctx context.Context, admin, name string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, connectTimeout+20*time.Second)
	defer cancel()
	demoURL, err := pgadmin.CreateDatabase(ctx, admin, name, "")
	if err != nil {
		return "", fmt.Errorf("create the demo database (the role needs the CREATEDB privilege): %w", err)
	}
	return demoURL, nil
}

// dropDemoDatabase drops database name, closing its connections. It runs
// on its own context so that it also cleans up after an interrupt.
func dropDemoDatabase(admin, name string) error {
	return pgadmin.DropDatabase(admin, name)
}

// demoInstances are the labels of the two processor instances.
var demoInstances = []string{"A", "B"}

// demoStore wraps a processor's store to count the non-empty claims and
// the heartbeat's renewals, which the processor does not count.
type demoStore struct {
	leasing.Store
	claims     atomic.Int64 // claims that returned at least one lease
	renewCalls atomic.Int64 // Renew calls that returned
	renewed    atomic.Int64 // leases those calls renewed

	mu           sync.Mutex
	renewedByMsg map[uuid.UUID]int
}

func (s *demoStore) Claim(ctx context.Context, r leasing.ClaimRequest) ([]leasing.Lease, error) {
	leases, err := s.Store.Claim(ctx, r)
	if err == nil && len(leases) > 0 {
		s.claims.Add(1)
	}
	return leases, err
}

func (s *demoStore) Renew(ctx context.Context, d time.Duration, leases ...leasing.Lease) (leasing.RenewResult, error) {
	res, err := s.Store.Renew(ctx, d, leases...)
	if err == nil {
		s.renewCalls.Add(1)
		s.renewed.Add(int64(len(res.Renewed)))
		s.mu.Lock()
		for _, l := range res.Renewed {
			s.renewedByMsg[l.Message.ID]++
		}
		s.mu.Unlock()
	}
	return res, err
}

// renewals returns how often the heartbeat renewed message id.
func (s *demoStore) renewals(id uuid.UUID) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.renewedByMsg[id]
}

// demoProc is one instance's processor on one queue.
type demoProc struct {
	instance string
	p        *processor.Processor
	store    *demoStore
	listener *processor.Listener
	ran      chan error // Run's result
}

// demoQueue is one queue's part of the demo: its messages, its two
// processors and what their handlers saw.
type demoQueue struct {
	queue    leasing.Queue
	store    *leasing.Postgres
	cfg      demoConfig
	backlog  []uuid.UUID
	late     []uuid.UUID
	lateAt   time.Time          // when the late messages were enqueued
	slow     uuid.UUID          // uuid.Nil when there is no slow message
	failOnce map[uuid.UUID]bool // messages whose first delivery fails
	procs    []*demoProc
	drainErr error

	mu         sync.Mutex
	failed     map[uuid.UUID]bool      // failOnce messages whose failing delivery happened
	deliveries map[uuid.UUID][]string  // instances, one per delivery
	handled    map[string][]uuid.UUID  // per instance, distinct messages in delivery order
	handledAt  map[uuid.UUID]time.Time // start of each message's last delivery
}

// deliver is the handler (inbox) and the publisher (outbox) of instance:
// it records the delivery, takes the handling time and fails a failOnce
// message's first delivery.
func (dq *demoQueue) deliver(ctx context.Context, instance string, id uuid.UUID) error {
	dq.mu.Lock()
	dq.deliveries[id] = append(dq.deliveries[id], instance)
	if !slices.Contains(dq.handled[instance], id) {
		dq.handled[instance] = append(dq.handled[instance], id)
	}
	dq.handledAt[id] = time.Now()
	fail := dq.failOnce[id] && !dq.failed[id]
	if fail {
		dq.failed[id] = true
	}
	dq.mu.Unlock()
	d := dq.cfg.HandleTime
	if id == dq.slow {
		d = dq.cfg.SlowTime
	}
	if err := sleepCtx(ctx, d); err != nil {
		return context.Cause(ctx)
	}
	if fail {
		return errors.New("demo: simulated failure on the first delivery")
	}
	return nil
}

// handler returns instance's handler for the queue: a Handler on the
// inbox, a Publisher to a stand-in broker on the outbox.
func (dq *demoQueue) handler(instance string) processor.Handler {
	if dq.queue == leasing.Outbox {
		publish := processor.Publisher(func(ctx context.Context, m leasing.Message) error {
			return dq.deliver(ctx, instance, m.ID)
		})
		return publish.Handler()
	}
	return func(ctx context.Context, l leasing.Lease) error {
		return dq.deliver(ctx, instance, l.Message.ID)
	}
}

// demoErrors collects the errors processors and listeners report.
type demoErrors struct {
	mu   sync.Mutex
	errs []error
}

func (e *demoErrors) add(err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.errs = append(e.errs, err)
}

func (e *demoErrors) all() []error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.errs)
}

// demoRun runs the demo on the migrated database behind pool: it
// enqueues, runs two processor instances per queue until the queue
// drains, and checks and prints the result.
func demoRun(ctx context.Context, out io.Writer, pool *pgxpool.Pool, cfg demoConfig) error {
	reader := sdkmetric.NewManualReader()
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer func() { _ = provider.Shutdown(context.Background()) }()
	var reported demoErrors

	queues := []*demoQueue{}
	var stores []leasing.Store
	for _, q := range []leasing.Queue{leasing.Inbox, leasing.Outbox} {
		store, err := newStore(pool, q)
		if err != nil {
			return err
		}
		dq := &demoQueue{
			queue: q, store: store, cfg: cfg, failOnce: map[uuid.UUID]bool{}, failed: map[uuid.UUID]bool{},
			deliveries: map[uuid.UUID][]string{}, handled: map[string][]uuid.UUID{}, handledAt: map[uuid.UUID]time.Time{},
		}
		dq.backlog, err = enqueueMany(ctx, store, cfg.Messages, dq.newMessage)
		if err != nil {
			return err
		}
		if cfg.SlowTime > 0 {
			dq.slow = dq.backlog[0]
		}
		// Spread the failing messages over the backlog, never the slow one.
		for i := range cfg.Fail {
			dq.failOnce[dq.backlog[1+i*(cfg.Messages-1)/cfg.Fail]] = true
		}
		queues = append(queues, dq)
		stores = append(stores, store)
	}
	fmt.Fprintf(out, "enqueued %d inbox and %d outbox messages; on each queue %d fail on their first delivery",
		cfg.Messages, cfg.Messages, cfg.Fail)
	if cfg.SlowTime > 0 {
		fmt.Fprintf(out, " and one takes %s, longer than the %s lease", cfg.SlowTime, demoLease)
	}
	fmt.Fprintln(out)

	gauges, err := processor.RegisterQueueGauges(provider.Meter("leasectl-demo"), stores...)
	if err != nil {
		return err
	}
	defer func() { _ = gauges.Unregister() }()

	// One processor per instance and queue, each with its own listener
	// (one wake reaches one receiver) and its own meter scope, so that the
	// counters can be read per instance.
	for _, dq := range queues {
		for _, inst := range demoInstances {
			l, err := processor.NewListener(pool.Config().ConnConfig, dq.queue, processor.ListenerOptions{OnError: reported.add})
			if err != nil {
				return err
			}
			store := &demoStore{Store: dq.store, renewedByMsg: map[uuid.UUID]int{}}
			p, err := processor.New(store, dq.handler(inst), processor.Options{
				Owner:             "demo-" + inst,
				BatchSize:         cfg.Batch,
				LeaseDuration:     demoLease,
				HeartbeatInterval: demoHeartbeat,
				Concurrency:       demoConcurrency,
				PollInterval:      demoPoll,
				RetryPolicy:       processor.RetryPolicy{InitialDelay: demoRetryDelay},
				Meter:             provider.Meter("leasectl-demo/" + inst),
				WorkSignal:        l,
				OnError:           reported.add,
			})
			if err != nil {
				return err
			}
			dq.procs = append(dq.procs, &demoProc{instance: inst, p: p, store: store, listener: l, ran: make(chan error, 1)})
		}
	}
	fmt.Fprintf(out, "processors: batch size %d, %d worker slots, lease %s renewed every %s, poll every %s and woken by LISTEN/NOTIFY, retry after %s\n",
		cfg.Batch, demoConcurrency, demoLease, demoHeartbeat, demoPoll, demoRetryDelay)
	for _, inst := range demoInstances {
		fmt.Fprintf(out, "  instance %s:", inst)
		for _, dq := range queues {
			for _, dp := range dq.procs {
				if dp.instance == inst {
					fmt.Fprintf(out, " %s owner %s;", dq.queue, dp.p.Owner())
				}
			}
		}
		fmt.Fprintln(out)
	}

	listenCtx, stopListening := context.WithCancel(ctx)
	var listeners sync.WaitGroup
	defer func() {
		stopListening()
		listeners.Wait()
	}()
	for _, dq := range queues {
		for _, dp := range dq.procs {
			listeners.Go(func() { _ = dp.listener.Run(listenCtx) })
		}
	}
	if err := demoWaitListening(ctx, queues); err != nil {
		return err
	}
	// Open the connections up front so that no processor starts late
	// because it waited for a new connection.
	if err := warmPool(ctx, pool, 2*len(queues)*len(demoInstances)); err != nil {
		return err
	}

	// Barrier: every processor goroutine is parked on start before any runs.
	start := make(chan struct{})
	var ready sync.WaitGroup
	for _, dq := range queues {
		for _, dp := range dq.procs {
			ready.Add(1)
			go func() {
				ready.Done()
				<-start
				dp.ran <- dp.p.Run(ctx)
			}()
		}
	}
	ready.Wait()
	began := time.Now()
	close(start)
	fmt.Fprintf(out, "started %d processors at the same moment\n", len(queues)*len(demoInstances))

	var drivers sync.WaitGroup
	for _, dq := range queues {
		drivers.Go(func() { dq.drainErr = dq.drive(ctx) })
	}
	drivers.Wait()
	if err := ctx.Err(); err != nil {
		return err
	}
	fmt.Fprintf(out, "all processors stopped after %s\n", time.Since(began).Round(time.Millisecond))
	stopListening()
	listeners.Wait()

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		return fmt.Errorf("collect metrics: %w", err)
	}
	counters := demoCounters(rm)

	ok := true
	for _, dq := range queues {
		if !dq.report(ctx, out, counters) {
			ok = false
		}
	}

	fmt.Fprintln(out, "\ncounters (OpenTelemetry SDK, manual reader), per instance")
	for _, dq := range queues {
		if !dq.printCounters(out, counters) {
			ok = false
		}
	}

	fmt.Fprintln(out, "\nqueue depth by status (litebus.<queue>.queue.depth gauges)")
	var all []leasing.Stats
	var wrongDepth []string
	for _, dq := range queues {
		st := demoGauges(rm, dq.queue)
		all = append(all, st)
		total := int64(len(dq.backlog) + len(dq.late))
		want := map[leasing.Status]int64{dq.queue.Succeeded(): total}
		for _, s := range dq.queue.Statuses() {
			if got, seen := st.Depth[s]; !seen || got != want[s] {
				wrongDepth = append(wrongDepth, fmt.Sprintf("FAIL: %s depth gauge for %s is %d (observed: %v), want %d", dq.queue, s, got, seen, want[s]))
			}
		}
	}
	if err := printStats(out, all); err != nil {
		return err
	}
	for _, line := range wrongDepth {
		fmt.Fprintln(out, line)
		ok = false
	}

	if errs := reported.all(); len(errs) > 0 {
		fmt.Fprintf(out, "\n%d errors reported by processors and listeners (retried):\n", len(errs))
		for _, err := range errs[:min(len(errs), 5)] {
			fmt.Fprintf(out, "  %v\n", err)
		}
	}
	if !ok {
		return errDemoFailed
	}
	fmt.Fprintln(out, "\nPASS: the instances handled disjoint subsets and every message ended completed/published")
	return nil
}

// newMessage returns the i-th demo message of the queue.
func (dq *demoQueue) newMessage(i int) leasing.NewMessage {
	m := leasing.NewMessage{Type: "demo.order_placed", Payload: fmt.Appendf(nil, `{"order":%d}`, i+1)}
	if dq.queue == leasing.Outbox {
		m.Type, m.Topic = "demo.order_confirmed", "orders"
	}
	return m
}

// demoWaitListening waits until every listener has its LISTEN in place.
func demoWaitListening(ctx context.Context, queues []*demoQueue) error {
	ctx, cancel := context.WithTimeout(ctx, connectTimeout+5*time.Second)
	defer cancel()
	for _, dq := range queues {
		for _, dp := range dq.procs {
			for dp.listener.BackendPID() == 0 {
				if err := sleepCtx(ctx, 5*time.Millisecond); err != nil {
					return fmt.Errorf("the %s listener of instance %s did not connect: %w", dq.queue, dp.instance, err)
				}
			}
		}
	}
	return nil
}

// drive waits for the backlog to be done, enqueues the late messages in
// one statement (its NOTIFY wakes the idle processors), waits for the
// queue to drain and stops both processors.
func (dq *demoQueue) drive(ctx context.Context) error {
	waitCtx, cancel := context.WithTimeout(ctx, demoDeadline)
	defer cancel()
	slow := 0
	if dq.slow != uuid.Nil {
		slow = 1
	}
	// The backlog is done, but for the slow message, once that many rows
	// are terminal.
	err := dq.waitStats(waitCtx, func(st leasing.Stats) bool {
		return st.Depth[dq.queue.Succeeded()]+st.Depth[leasing.StatusDeadLettered] >= int64(len(dq.backlog)-slow)
	})
	if err == nil && dq.cfg.Late > 0 {
		dq.lateAt = time.Now()
		dq.late, err = enqueueMany(waitCtx, dq.store, dq.cfg.Late, func(i int) leasing.NewMessage {
			return dq.newMessage(len(dq.backlog) + i)
		})
	}
	if err == nil {
		total := int64(len(dq.backlog) + len(dq.late))
		err = dq.waitStats(waitCtx, func(st leasing.Stats) bool {
			return st.Depth[dq.queue.Succeeded()]+st.Depth[leasing.StatusDeadLettered] == total
		})
	}
	// Stop both processors however the wait ended.
	stopCtx, cancelStop := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancelStop()
	errs := make([]error, len(dq.procs))
	var stops sync.WaitGroup
	for i, dp := range dq.procs {
		stops.Go(func() {
			if err := dp.p.Stop(stopCtx); err != nil {
				errs[i] = fmt.Errorf("stop the %s processor of instance %s: %w", dq.queue, dp.instance, err)
				return
			}
			errs[i] = <-dp.ran // Run has returned: Stop waited for it
		})
	}
	stops.Wait()
	return errors.Join(append([]error{err}, errs...)...)
}

// waitStats reads the queue's Stats until done reports true.
func (dq *demoQueue) waitStats(ctx context.Context, done func(leasing.Stats) bool) error {
	for {
		st, err := dq.store.Stats(ctx)
		if err == nil && done(st) {
			return nil
		}
		if err := sleepCtx(ctx, demoStatsEvery); err != nil {
			return fmt.Errorf("%s queue did not drain: %w", dq.queue, err)
		}
	}
}

// report prints what each instance handled and checks the queue; it
// reports whether every check passed.
func (dq *demoQueue) report(ctx context.Context, out io.Writer, counters map[string]map[string]int64) bool {
	q := dq.queue
	all := slices.Concat(dq.backlog, dq.late)
	fmt.Fprintf(out, "\n%s (%d messages: %d before the start, %d once the backlog was done)\n", q, len(all), len(dq.backlog), len(dq.late))
	ok := true
	if dq.drainErr != nil {
		fmt.Fprintf(out, "  FAIL: %v\n", dq.drainErr)
		ok = false
	}
	lost := int64(0)
	for _, dp := range dq.procs {
		lost += counters[dp.instance][processor.MetricName(q, "processor.lease_lost")]
	}

	dq.mu.Lock()
	defer dq.mu.Unlock()
	handledBy := map[uuid.UUID][]string{}
	for _, dp := range dq.procs {
		ids := dq.handled[dp.instance]
		fmt.Fprintf(out, "  instance %s (%s) handled %3d messages, claimed in %2d batches: %s\n",
			dp.instance, dp.p.Owner(), len(ids), dp.store.claims.Load(), joinIDs(ids, 3))
		for _, id := range ids {
			handledBy[id] = append(handledBy[id], dp.instance)
		}
	}

	var retriedElsewhere, overlap, missing, wrongCount []uuid.UUID
	for _, id := range all {
		switch by := handledBy[id]; {
		case len(by) == 0:
			missing = append(missing, id)
		case len(by) > 1 && dq.failOnce[id]:
			retriedElsewhere = append(retriedElsewhere, id)
		case len(by) > 1:
			overlap = append(overlap, id)
		}
		want := 1
		if dq.failOnce[id] {
			want = 2
		}
		if n := len(dq.deliveries[id]); n != want && lost == 0 {
			wrongCount = append(wrongCount, id)
		}
	}
	switch {
	case len(overlap) > 0 && lost == 0:
		fmt.Fprintf(out, "  FAIL: not disjoint: %d messages handled by both instances without a lost lease: %s\n", len(overlap), joinIDs(overlap, 5))
		ok = false
	case len(overlap) > 0:
		fmt.Fprintf(out, "  disjoint: no: %d messages handled by both instances after %d lost leases: %s\n", len(overlap), lost, joinIDs(overlap, 5))
	case len(retriedElsewhere) > 0:
		fmt.Fprintf(out, "  disjoint: yes, apart from %s that failed once on purpose, retried by the other instance: %s\n",
			demoCount(len(retriedElsewhere), "message"), joinIDs(retriedElsewhere, 3))
	default:
		fmt.Fprintln(out, "  disjoint: yes, no message was handled by both instances")
	}
	if len(missing) > 0 {
		fmt.Fprintf(out, "  FAIL: %d messages were never handled: %s\n", len(missing), joinIDs(missing, 5))
		ok = false
	}
	if len(wrongCount) > 0 {
		fmt.Fprintf(out, "  FAIL: %d messages were not delivered once (twice when failing once): %s\n", len(wrongCount), joinIDs(wrongCount, 5))
		ok = false
	}
	fmt.Fprintf(out, "  retried: %d messages failed once and succeeded on their second delivery\n", len(dq.failed))

	if dq.slow != uuid.Nil {
		renewals := 0
		for _, dp := range dq.procs {
			renewals += dp.store.renewals(dq.slow)
		}
		row, err := dq.store.Get(ctx, dq.slow)
		switch {
		case err != nil:
			fmt.Fprintf(out, "  FAIL: read the slow message: %v\n", err)
			ok = false
		case row.LeaseGeneration != 1 || len(dq.deliveries[dq.slow]) != 1:
			fmt.Fprintf(out, "  FAIL: the slow message %s was claimed %d times and delivered %d times\n",
				dq.slow, row.LeaseGeneration, len(dq.deliveries[dq.slow]))
			ok = false
		default:
			fmt.Fprintf(out, "  slow message %s: handled for %s by instance %s; the heartbeat renewed its %s lease %d times and no one reclaimed it\n",
				dq.slow, dq.cfg.SlowTime, dq.deliveries[dq.slow][0], demoLease, renewals)
		}
	}
	if len(dq.late) > 0 {
		var last time.Time
		for _, id := range dq.late {
			if at := dq.handledAt[id]; at.After(last) {
				last = at
			}
		}
		if !last.IsZero() {
			fmt.Fprintf(out, "  late messages: the last of %d was picked up %s after their insert (the poll interval is %s: LISTEN/NOTIFY woke the processors)\n",
				len(dq.late), last.Sub(dq.lateAt).Round(time.Millisecond), demoPoll)
		}
	}

	finished, notFinished, err := countFinished(ctx, dq.store, all)
	switch {
	case err != nil:
		fmt.Fprintf(out, "  FAIL: read the messages: %v\n", err)
		ok = false
	case len(notFinished) == 0:
		fmt.Fprintf(out, "  every message ended %s: %d of %d\n", q.Succeeded(), finished, len(all))
	default:
		fmt.Fprintf(out, "  FAIL: %d of %d messages ended %s; not: %s\n", finished, len(all), q.Succeeded(), joinIDs(notFinished, 5))
		ok = false
	}
	return ok
}

// demoCount returns "1 noun" or "n nouns".
func demoCount(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// demoCounterNames are the processor counters in print order;
// "succeeded" stands for the outbox's "published".
var demoCounterNames = []string{
	"leases_acquired", "succeeded", "failed", "dead_lettered", "lease_lost", "persist_skipped", "persist_rejected",
}

// printCounters prints the queue's counters per instance and in total,
// and the heartbeat's renewals, and checks the totals; it reports whether
// the checks passed.
func (dq *demoQueue) printCounters(out io.Writer, counters map[string]map[string]int64) bool {
	q := dq.queue
	fmt.Fprintf(out, "  %-42s %8s %8s %8s\n", q, "A", "B", "total")
	total := map[string]int64{}
	row := func(name string, value func(dp *demoProc) int64) {
		fmt.Fprintf(out, "  %-42s", name)
		var sum int64
		for _, dp := range dq.procs {
			v := value(dp)
			sum += v
			fmt.Fprintf(out, " %8d", v)
		}
		fmt.Fprintf(out, " %8d\n", sum)
		total[name] = sum
	}
	for _, short := range demoCounterNames {
		name := "processor." + short
		if short == "succeeded" {
			name = processor.SucceededCounter(q)
		}
		full := processor.MetricName(q, name)
		row(full, func(dp *demoProc) int64 { return counters[dp.instance][full] })
		total[short] = total[full]
	}
	row("heartbeat renew calls (not an OTel counter)", func(dp *demoProc) int64 { return dp.store.renewCalls.Load() })
	row("leases renewed (not an OTel counter)", func(dp *demoProc) int64 { return dp.store.renewed.Load() })

	messages := int64(len(dq.backlog) + len(dq.late))
	want := map[string]int64{
		"succeeded": messages, "failed": int64(dq.cfg.Fail), "dead_lettered": 0, "persist_rejected": 0,
	}
	if total["lease_lost"] == 0 {
		want["leases_acquired"] = messages + int64(dq.cfg.Fail)
		want["persist_skipped"] = 0
	}
	ok := true
	for _, short := range demoCounterNames {
		if w, checked := want[short]; checked && total[short] != w {
			fmt.Fprintf(out, "  FAIL: %s %s total is %d, want %d\n", q, short, total[short], w)
			ok = false
		}
	}
	return ok
}

// demoCounters returns the int64 counter values in rm by instance (the
// meter scope "leasectl-demo/<instance>") and instrument name.
func demoCounters(rm metricdata.ResourceMetrics) map[string]map[string]int64 {
	out := map[string]map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		inst, found := strings.CutPrefix(sm.Scope.Name, "leasectl-demo/")
		if !found {
			continue
		}
		if out[inst] == nil {
			out[inst] = map[string]int64{}
		}
		for _, m := range sm.Metrics {
			if sum, ok := m.Data.(metricdata.Sum[int64]); ok {
				for _, dp := range sum.DataPoints {
					out[inst][m.Name] += dp.Value
				}
			}
		}
	}
	return out
}

// demoGauges returns queue q's gauges in rm as Stats.
func demoGauges(rm metricdata.ResourceMetrics, q leasing.Queue) leasing.Stats {
	st := leasing.Stats{Queue: q, Depth: map[leasing.Status]int64{}}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch m.Name {
			case processor.MetricName(q, "queue.depth"):
				if g, ok := m.Data.(metricdata.Gauge[int64]); ok {
					for _, dp := range g.DataPoints {
						if s, ok := dp.Attributes.Value("status"); ok {
							st.Depth[leasing.Status(s.AsString())] = dp.Value
						}
					}
				}
			case processor.MetricName(q, "queue.expired_leases"):
				if g, ok := m.Data.(metricdata.Gauge[int64]); ok && len(g.DataPoints) > 0 {
					st.ExpiredLeases = g.DataPoints[0].Value
				}
			case processor.MetricName(q, "queue.oldest_due_age"):
				if g, ok := m.Data.(metricdata.Gauge[float64]); ok && len(g.DataPoints) > 0 {
					st.OldestDueAge = time.Duration(g.DataPoints[0].Value * float64(time.Second))
				}
			}
		}
	}
	return st
}

// warmPool opens n connections in pool and puts them back.
func warmPool(ctx context.Context, pool *pgxpool.Pool, n int) error {
	conns := make([]*pgxpool.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	for range n {
		c, err := pool.Acquire(ctx)
		if err != nil {
			return err
		}
		conns = append(conns, c)
	}
	return nil
}

// countFinished returns how many of ids are in the queue's success state
// (completed or published), and the ids that are not.
func countFinished(ctx context.Context, store *leasing.Postgres, ids []uuid.UUID) (int, []uuid.UUID, error) {
	status := make(map[uuid.UUID]leasing.Status, len(ids))
	var after time.Time
	afterID := uuid.Nil
	for {
		rows, err := store.List(ctx, after, afterID, leasing.MaxBatchSize)
		if err != nil {
			return 0, nil, err
		}
		for _, r := range rows {
			status[r.ID] = r.Status
		}
		if len(rows) < leasing.MaxBatchSize {
			break
		}
		last := rows[len(rows)-1]
		after, afterID = last.CreatedAt, last.ID
	}
	finished := 0
	var not []uuid.UUID
	for _, id := range ids {
		if status[id] == store.Queue().Succeeded() {
			finished++
		} else {
			not = append(not, id)
		}
	}
	return finished, not, nil
}
