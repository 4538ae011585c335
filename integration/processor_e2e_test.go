package integration

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/leasestore/leasestore/integration/dbtest"
	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/leasingtest"
	"github.com/leasestore/leasestore/leasing/processor"
)

// e2eQueues are the queues every end-to-end case runs on: the inbox with a
// handler, the outbox with a Publisher that publishes to an e2eBroker.
var e2eQueues = []leasing.Queue{leasing.Inbox, leasing.Outbox}

// e2eTopic is the topic of every outbox message the cases enqueue.
const e2eTopic = "orders"

// e2eWait bounds every wait for a condition. It is a timeout, not a
// timing assertion: conditions normally hold within milliseconds.
const e2eWait = 10 * time.Second

// e2eDelivery is one handler call (inbox) or one publish to the fake broker
// (outbox): which processor got which message under which lease owner.
type e2eDelivery struct {
	Proc      string // the processor's label
	Owner     string // its lease owner name
	MessageID uuid.UUID
	TenantID  string
	Topic     string // outbox only
}

// e2eBroker records every delivery in order. On the outbox it is the
// in-process fake broker; on the inbox the log of handler calls.
type e2eBroker struct {
	mu         sync.Mutex
	deliveries []e2eDelivery
}

func (b *e2eBroker) record(d e2eDelivery) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.deliveries = append(b.deliveries, d)
}

// all returns a copy of the deliveries so far.
func (b *e2eBroker) all() []e2eDelivery {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.deliveries)
}

// of returns the deliveries of message id, in order.
func (b *e2eBroker) of(id uuid.UUID) []e2eDelivery {
	var out []e2eDelivery
	for _, d := range b.all() {
		if d.MessageID == id {
			out = append(out, d)
		}
	}
	return out
}

// e2eBehaviour is what a case's handler or publisher does with a message.
type e2eBehaviour func(ctx context.Context, msg leasing.Message) error

func e2eOK(context.Context, leasing.Message) error { return nil }

// errE2ECrashed is what every call of a crashed e2eStore returns.
var errE2ECrashed = errors.New("e2e: worker process is gone")

// e2eStore wraps a processor's store: it records the claims that returned
// and, once crashed, fails every lease call as if the worker's process had
// frozen or lost its network, so that it never writes again.
type e2eStore struct {
	leasing.Store
	crashed atomic.Bool
	claims  atomic.Int64 // Claim calls that returned without error

	mu      sync.Mutex
	batches [][]uuid.UUID // ids of each non-empty claim, in claim order
}

func (s *e2eStore) Claim(ctx context.Context, r leasing.ClaimRequest) ([]leasing.Lease, error) {
	if s.crashed.Load() {
		return nil, errE2ECrashed
	}
	leases, err := s.Store.Claim(ctx, r)
	if err != nil {
		return leases, err
	}
	if len(leases) > 0 {
		ids := make([]uuid.UUID, len(leases))
		for i, l := range leases {
			ids[i] = l.Message.ID
		}
		s.mu.Lock()
		s.batches = append(s.batches, ids)
		s.mu.Unlock()
	}
	s.claims.Add(1)
	return leases, nil
}

func (s *e2eStore) Renew(ctx context.Context, d time.Duration, leases ...leasing.Lease) (leasing.RenewResult, error) {
	if s.crashed.Load() {
		return leasing.RenewResult{}, errE2ECrashed
	}
	return s.Store.Renew(ctx, d, leases...)
}

func (s *e2eStore) Release(ctx context.Context, leases ...leasing.Lease) (leasing.WriteResult, error) {
	if s.crashed.Load() {
		return leasing.WriteResult{}, errE2ECrashed
	}
	return s.Store.Release(ctx, leases...)
}

func (s *e2eStore) Complete(ctx context.Context, leases ...leasing.Lease) (leasing.WriteResult, error) {
	if s.crashed.Load() {
		return leasing.WriteResult{}, errE2ECrashed
	}
	return s.Store.Complete(ctx, leases...)
}

func (s *e2eStore) Fail(ctx context.Context, failures ...leasing.Failure) (leasing.WriteResult, error) {
	if s.crashed.Load() {
		return leasing.WriteResult{}, errE2ECrashed
	}
	return s.Store.Fail(ctx, failures...)
}

func (s *e2eStore) DeadLetter(ctx context.Context, failures ...leasing.Failure) (leasing.WriteResult, error) {
	if s.crashed.Load() {
		return leasing.WriteResult{}, errE2ECrashed
	}
	return s.Store.DeadLetter(ctx, failures...)
}

// claimed returns the ids of every non-empty claim, in claim order.
func (s *e2eStore) claimed() [][]uuid.UUID {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.batches)
}

// e2eBundle is one case's database, pinned clock and delivery log.
type e2eBundle struct {
	queue  leasing.Queue
	url    string
	clock  *leasingtest.Clock
	store  *leasing.Postgres // the test's own pool: enqueue, read, requeue
	broker *e2eBroker
}

func e2eSetup(t *testing.T, q leasing.Queue) *e2eBundle {
	t.Helper()
	b := &e2eBundle{
		queue: q, url: dbtest.DatabaseURL(t), clock: leasingtest.NewClock(leasingtest.Start), broker: &e2eBroker{},
	}
	b.store = b.openStore(t)
	return b
}

// openStore returns a store on its own pool, on the case's pinned clock, so
// that each processor contends from its own connections.
func (b *e2eBundle) openStore(t *testing.T) *leasing.Postgres {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(b.url)
	require.NoError(t, err)
	cfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	store, err := leasing.NewPostgres(pool, b.queue, leasing.PostgresOptions{Now: b.clock.Now})
	require.NoError(t, err)
	return store
}

// enqueue adds msgs (the outbox ones get e2eTopic) and returns their ids in
// claim order.
func (b *e2eBundle) enqueue(t *testing.T, msgs ...leasing.NewMessage) []uuid.UUID {
	t.Helper()
	for i := range msgs {
		if msgs[i].Type == "" {
			msgs[i].Type = "e2e"
		}
		if b.queue == leasing.Outbox {
			msgs[i].Topic = e2eTopic
		}
	}
	res, err := b.store.Enqueue(context.Background(), msgs...)
	require.NoError(t, err)
	require.Empty(t, res.Duplicates)
	return res.IDs
}

func (b *e2eBundle) enqueueN(t *testing.T, n int) []uuid.UUID {
	t.Helper()
	msgs := make([]leasing.NewMessage, n)
	for i := range msgs {
		msgs[i].Payload = fmt.Appendf(nil, `{"n":%d}`, i)
	}
	return b.enqueue(t, msgs...)
}

func (b *e2eBundle) row(t *testing.T, id uuid.UUID) leasing.Row {
	t.Helper()
	r, err := b.store.Get(context.Background(), id)
	require.NoError(t, err)
	return r
}

// peek returns the row of id, the zero Row when it cannot be read; it never
// fails the test, so that wait conditions may call it.
func (b *e2eBundle) peek(id uuid.UUID) leasing.Row {
	r, _ := b.store.Get(context.Background(), id)
	return r
}

func (b *e2eBundle) waitFor(t *testing.T, cond func() bool, msg string, args ...any) {
	t.Helper()
	require.Eventually(t, cond, e2eWait, 2*time.Millisecond, append([]any{msg}, args...)...)
}

func (b *e2eBundle) waitStatus(t *testing.T, id uuid.UUID, s leasing.Status) {
	t.Helper()
	b.waitFor(t, func() bool { return b.peek(id).Status == s }, "message %s never became %s (is %s)", id, s, b.peek(id).Status)
}

// rawClaim claims like a worker outside any processor.
func (b *e2eBundle) rawClaim(t *testing.T, owner string, n int) []leasing.Lease {
	t.Helper()
	leases, err := b.store.Claim(context.Background(), leasing.ClaimRequest{Owner: owner, BatchSize: n, LeaseFor: 30 * time.Second})
	require.NoError(t, err)
	return leases
}

// e2eProc is a processor with its own pool, meter provider and manual
// reader.
type e2eProc struct {
	label    string
	queue    leasing.Queue
	p        *processor.Processor
	store    *e2eStore
	reader   *sdkmetric.ManualReader
	provider *sdkmetric.MeterProvider

	cancel  context.CancelFunc
	errc    chan error
	started bool
	once    sync.Once
	err     error
}

// newProc builds a processor labelled label that runs behave on each
// message. Unless opts sets them: Owner is the label, the lease is 30s of
// the pinned clock, poll and heartbeat run every 10ms (real time) and the
// shutdown grace is 2s. Call run to start it; cleanup stops it.
func (b *e2eBundle) newProc(t *testing.T, label string, behave e2eBehaviour, opts processor.Options) *e2eProc {
	t.Helper()
	if opts.Owner == "" {
		opts.Owner = label
	}
	if opts.LeaseDuration == 0 {
		opts.LeaseDuration = 30 * time.Second
	}
	if opts.PollInterval == 0 {
		opts.PollInterval = 10 * time.Millisecond
	}
	if opts.HeartbeatInterval == 0 {
		opts.HeartbeatInterval = 10 * time.Millisecond
	}
	if opts.ShutdownGrace == 0 {
		opts.ShutdownGrace = 2 * time.Second
	}
	reader := sdkmetric.NewManualReader()
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	opts.Meter = provider.Meter("e2e")
	pr := &e2eProc{
		label: label, queue: b.queue, store: &e2eStore{Store: b.openStore(t)},
		reader: reader, provider: provider, errc: make(chan error, 1),
	}
	var handler processor.Handler
	if b.queue == leasing.Outbox {
		publish := processor.Publisher(func(ctx context.Context, m leasing.Message) error {
			b.broker.record(e2eDelivery{Proc: label, Owner: pr.p.Owner(), MessageID: m.ID, TenantID: m.TenantID, Topic: m.Topic})
			return behave(ctx, m)
		})
		handler = publish.Handler()
	} else {
		handler = func(ctx context.Context, l leasing.Lease) error {
			b.broker.record(e2eDelivery{Proc: label, Owner: l.Owner, MessageID: l.Message.ID, TenantID: l.Message.TenantID})
			return behave(ctx, l.Message)
		}
	}
	p, err := processor.New(pr.store, handler, opts)
	require.NoError(t, err)
	pr.p = p
	t.Cleanup(func() {
		require.NoError(t, pr.stop(t))
		require.NoError(t, provider.Shutdown(context.Background()))
	})
	return pr
}

// run starts the processor's Run in a goroutine.
func (pr *e2eProc) run() {
	gate := make(chan struct{})
	close(gate)
	pr.runAfter(gate, &sync.WaitGroup{})
}

// runAfter starts a goroutine that marks parked done, waits for gate to
// close and runs the processor.
func (pr *e2eProc) runAfter(gate <-chan struct{}, parked *sync.WaitGroup) {
	ctx, cancel := context.WithCancel(context.Background())
	pr.cancel, pr.started = cancel, true
	parked.Add(1)
	go func() {
		parked.Done()
		<-gate
		pr.errc <- pr.p.Run(ctx)
	}()
}

func (b *e2eBundle) start(t *testing.T, label string, behave e2eBehaviour, opts processor.Options) *e2eProc {
	t.Helper()
	pr := b.newProc(t, label, behave, opts)
	pr.run()
	return pr
}

// stop stops the processor and returns what Run returned; later calls
// return the same.
func (pr *e2eProc) stop(t *testing.T) error {
	t.Helper()
	pr.once.Do(func() {
		if !pr.started {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 3*e2eWait)
		defer cancel()
		require.NoError(t, pr.p.Stop(ctx), "processor %s did not stop", pr.label)
		pr.err = <-pr.errc
		pr.cancel()
	})
	return pr.err
}

// claimsMark notes how many claims the processor has made; the returned
// func gives a wait condition that holds once it has made n more.
func (pr *e2eProc) claimsMark() func(n int64) func() bool {
	base := pr.store.claims.Load()
	return func(n int64) func() bool {
		return func() bool { return pr.store.claims.Load() >= base+n }
	}
}

// e2eCounterNames are the processor counters, as the processor package names them
// and the seed, with "succeeded" standing for the outbox's "published".
var e2eCounterNames = []string{
	"leases_acquired", "succeeded", "failed", "dead_lettered", "lease_lost", "persist_skipped", "persist_rejected",
}

// e2eCounterName returns the full instrument name of short counter name on
// queue q: litebus.<q>.processor.<name>, "published" for the outbox's
// "succeeded".
func e2eCounterName(q leasing.Queue, name string) string {
	if name == "succeeded" && q == leasing.Outbox {
		name = "published"
	}
	return "litebus." + string(q) + ".processor." + name
}

// collect reads the processor's meter.
func (pr *e2eProc) collect(t *testing.T) metricdata.ResourceMetrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, pr.reader.Collect(context.Background(), &rm))
	return rm
}

// counters returns every processor counter by full name, 0 for those never
// added to.
func (pr *e2eProc) counters(t *testing.T) map[string]int64 {
	t.Helper()
	got := map[string]int64{}
	for _, name := range e2eCounterNames {
		got[e2eCounterName(pr.queue, name)] = 0
	}
	for _, sm := range pr.collect(t).ScopeMetrics {
		for _, m := range sm.Metrics {
			sum, ok := m.Data.(metricdata.Sum[int64])
			if !ok {
				continue
			}
			_, known := got[m.Name]
			require.True(t, known, "unexpected counter %s", m.Name)
			require.True(t, sum.IsMonotonic, m.Name)
			for _, dp := range sum.DataPoints {
				got[m.Name] += dp.Value
			}
		}
	}
	return got
}

// counter returns one counter by short name; it never fails the test, so
// that wait conditions may call it (-1 when it cannot be read).
func (pr *e2eProc) counter(name string) int64 {
	var rm metricdata.ResourceMetrics
	if err := pr.reader.Collect(context.Background(), &rm); err != nil {
		return -1
	}
	full := e2eCounterName(pr.queue, name)
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if sum, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == full {
				var total int64
				for _, dp := range sum.DataPoints {
					total += dp.Value
				}
				return total
			}
		}
	}
	return 0
}

// requireCounters checks every processor counter: those want leaves out
// must be 0. Keys are short names ("succeeded" for the outbox's
// "published").
func (pr *e2eProc) requireCounters(t *testing.T, want map[string]int64) {
	t.Helper()
	full := map[string]int64{}
	for _, name := range e2eCounterNames {
		full[e2eCounterName(pr.queue, name)] = want[name]
	}
	for name := range want {
		require.Contains(t, e2eCounterNames, name)
	}
	require.Equal(t, full, pr.counters(t), "processor %s counters", pr.label)
}

// waitCounters waits until the processor counters are want (as for
// requireCounters), then checks them.
func (pr *e2eProc) waitCounters(t *testing.T, want map[string]int64) {
	t.Helper()
	require.Eventually(t, func() bool {
		for _, name := range e2eCounterNames {
			if pr.counter(name) != want[name] {
				return false
			}
		}
		return true
	}, e2eWait, 2*time.Millisecond, "processor %s counters never reached %v", pr.label, want)
	pr.requireCounters(t, want)
}

// e2eGauges returns the queue gauges of queue q that RegisterQueueGauges
// feeds: depth by status, expired leases.
func e2eGauges(t *testing.T, rm metricdata.ResourceMetrics, q leasing.Queue) (map[leasing.Status]int64, int64) {
	t.Helper()
	depth := map[leasing.Status]int64{}
	expired := int64(-1)
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch m.Name {
			case "litebus." + string(q) + ".queue.depth":
				for _, dp := range m.Data.(metricdata.Gauge[int64]).DataPoints {
					status, ok := dp.Attributes.Value("status")
					require.True(t, ok, "depth point without status")
					depth[leasing.Status(status.AsString())] = dp.Value
				}
			case "litebus." + string(q) + ".queue.expired_leases":
				points := m.Data.(metricdata.Gauge[int64]).DataPoints
				require.Len(t, points, 1)
				expired = points[0].Value
			}
		}
	}
	return depth, expired
}

// e2eDepth returns the expected depth map: every status of q, 0 unless set.
func e2eDepth(q leasing.Queue, set map[leasing.Status]int64) map[leasing.Status]int64 {
	out := map[leasing.Status]int64{}
	for _, s := range q.Statuses() {
		out[s] = set[s]
	}
	return out
}

// TestProcessorEndToEnd runs processors on real PostgreSQL, for the inbox
// (handler) and the outbox (publisher and fake broker). Each case has its
// own database; every processor has its own pool. The database clock is
// pinned (PostgresOptions.Now) and stepped with a manual clock, so no case
// sleeps for a lease or a backoff to run out: leases are 30s and retry
// delays seconds of the pinned clock, while poll and heartbeat tick every
// 10ms of real time.
func TestProcessorEndToEnd(t *testing.T) {
	t.Parallel()
	for _, q := range e2eQueues {
		t.Run(string(q), func(t *testing.T) {
			t.Parallel()
			testProcessorEndToEnd(t, q)
		})
	}
}

func testProcessorEndToEnd(t *testing.T, q leasing.Queue) {
	ctx := context.Background()

	t.Run("Success", func(t *testing.T) {
		t.Parallel()
		b := e2eSetup(t, q)
		ids := b.enqueueN(t, 5)
		// One slot: deliveries follow claim order, which is FIFO.
		p := b.start(t, "a", e2eOK, processor.Options{Concurrency: 1})
		for _, id := range ids {
			b.waitStatus(t, id, q.Succeeded())
		}
		require.NoError(t, p.stop(t)) // Run returns once every outcome is written and counted

		var delivered []uuid.UUID
		for _, d := range b.broker.all() {
			delivered = append(delivered, d.MessageID)
			require.Equal(t, p.p.Owner(), d.Owner)
			if q == leasing.Outbox {
				require.Equal(t, e2eTopic, d.Topic, "published to the message's topic")
			}
		}
		require.Equal(t, ids, delivered, "each message delivered once, in FIFO order")
		for _, id := range ids {
			r := b.row(t, id)
			require.Equal(t, 1, r.AttemptCount)
			require.Equal(t, int64(1), r.LeaseGeneration)
			require.Equal(t, p.p.Owner(), r.LeaseOwner)
			require.Nil(t, r.LeaseExpiresAt)
			require.NotNil(t, r.FinishedAt)
			require.Equal(t, b.clock.Now(), *r.FinishedAt, "finished at the store's (pinned) now")
			require.Empty(t, r.LastError)
		}
		p.requireCounters(t, map[string]int64{"leases_acquired": 5, "succeeded": 5})
	})

	t.Run("FailureThenRetryAfterBackoffThenSuccess", func(t *testing.T) {
		t.Parallel()
		b := e2eSetup(t, q)
		id := b.enqueueN(t, 1)[0]
		t0 := b.clock.Now()
		var calls atomic.Int32
		p := b.start(t, "a", func(context.Context, leasing.Message) error {
			if calls.Add(1) == 1 {
				return errors.New("downstream unavailable")
			}
			return nil
		}, processor.Options{RetryPolicy: processor.RetryPolicy{InitialDelay: time.Minute}})

		b.waitStatus(t, id, leasing.StatusFailed)
		r := b.row(t, id)
		require.Equal(t, "downstream unavailable", r.LastError)
		require.Equal(t, 1, r.AttemptCount)
		require.Nil(t, r.LeaseExpiresAt)
		require.Equal(t, t0.Add(time.Minute), r.VisibleAfter, "due again after the backoff, on the store's clock")

		// The processor keeps claiming, but the message is not due yet.
		b.waitFor(t, p.claimsMark()(3), "three more claims")
		require.EqualValues(t, 1, calls.Load(), "not retried before the backoff ends")
		require.Empty(t, b.rawClaim(t, "other", 10), "not visible to anyone before the backoff ends")

		b.clock.Advance(time.Minute)
		b.waitStatus(t, id, q.Succeeded())
		require.NoError(t, p.stop(t))
		r = b.row(t, id)
		require.Equal(t, 2, r.AttemptCount)
		require.Equal(t, int64(2), r.LeaseGeneration)
		require.EqualValues(t, 2, calls.Load())
		require.Len(t, b.broker.of(id), 2, "delivered twice: the failed attempt and the retry")
		p.requireCounters(t, map[string]int64{"leases_acquired": 2, "failed": 1, "succeeded": 1})
	})

	t.Run("FailuresUntilDeadLetterThenRequeueThenSuccess", func(t *testing.T) {
		t.Parallel()
		b := e2eSetup(t, q)
		id := b.enqueueN(t, 1)[0]
		var calls atomic.Int32
		var poisoned atomic.Bool
		poisoned.Store(true)
		p := b.start(t, "a", func(context.Context, leasing.Message) error {
			n := calls.Add(1)
			if poisoned.Load() {
				return fmt.Errorf("poison, call %d", n)
			}
			return nil
		}, processor.Options{RetryPolicy: processor.RetryPolicy{MaxAttempts: 3, InitialDelay: time.Second, Multiplier: 2}})

		for _, step := range []struct {
			attempt int
			delay   time.Duration
		}{{1, time.Second}, {2, 2 * time.Second}} {
			b.waitFor(t, func() bool {
				r := b.peek(id)
				return r.Status == leasing.StatusFailed && r.AttemptCount == step.attempt
			}, "failed on attempt %d", step.attempt)
			r := b.row(t, id)
			require.Equal(t, fmt.Sprintf("poison, call %d", step.attempt), r.LastError)
			require.Equal(t, b.clock.Now().Add(step.delay), r.VisibleAfter, "exponential backoff")
			b.clock.Advance(step.delay)
		}
		b.waitStatus(t, id, leasing.StatusDeadLettered)
		r := b.row(t, id)
		require.Equal(t, 3, r.AttemptCount)
		require.Equal(t, "poison, call 3", r.LastError)
		require.NotNil(t, r.DeadLetteredAt)
		require.Equal(t, b.clock.Now(), *r.DeadLetteredAt)
		require.Nil(t, r.LeaseExpiresAt)

		// Dead-lettered is terminal: claims pass it by, even much later.
		b.clock.Advance(time.Hour)
		b.waitFor(t, p.claimsMark()(3), "three more claims")
		require.EqualValues(t, 3, calls.Load())
		require.Equal(t, leasing.StatusDeadLettered, b.row(t, id).Status)

		poisoned.Store(false)
		res, err := b.store.Requeue(ctx, id)
		require.NoError(t, err)
		require.Equal(t, 1, res.Requested)
		require.Equal(t, []uuid.UUID{id}, res.Requeued)
		b.waitStatus(t, id, q.Succeeded())
		require.NoError(t, p.stop(t))
		r = b.row(t, id)
		require.Equal(t, 1, r.AttemptCount, "requeue resets the attempts")
		require.Equal(t, int64(4), r.LeaseGeneration, "the generation never resets")
		require.Empty(t, r.LastError, "requeue clears the error")
		require.Nil(t, r.DeadLetteredAt)
		require.EqualValues(t, 4, calls.Load())
		p.requireCounters(t, map[string]int64{"leases_acquired": 4, "failed": 2, "dead_lettered": 1, "succeeded": 1})
	})

	t.Run("WorkerDiesMidLeaseThenReclaimAfterExpiry", func(t *testing.T) {
		t.Parallel()
		b := e2eSetup(t, q)
		id := b.enqueueN(t, 1)[0]
		started := make(chan struct{})
		// a takes the message, then its process "dies": from then on every
		// store call it makes fails, so it never renews or writes again.
		a := b.start(t, "a", func(ctx context.Context, _ leasing.Message) error {
			close(started)
			<-ctx.Done()
			return context.Cause(ctx)
		}, processor.Options{Concurrency: 1, BatchSize: 1, ShutdownGrace: 10 * time.Millisecond})
		<-started
		a.store.crashed.Store(true)
		r := b.row(t, id)
		require.Equal(t, q.InFlight(), r.Status)
		require.Equal(t, a.p.Owner(), r.LeaseOwner)
		require.Equal(t, b.clock.Now().Add(30*time.Second), *r.LeaseExpiresAt)

		bp := b.start(t, "b", e2eOK, processor.Options{})
		b.waitFor(t, bp.claimsMark()(3), "b claims three times")
		require.Empty(t, b.broker.of(id)[1:], "b leaves a live lease alone")

		b.clock.Advance(31 * time.Second) // past a's lease
		b.waitStatus(t, id, q.Succeeded())
		r = b.row(t, id)
		require.Equal(t, bp.p.Owner(), r.LeaseOwner, "b reclaimed and finished it")
		require.Equal(t, int64(2), r.LeaseGeneration)
		require.Equal(t, 2, r.AttemptCount, "the lost attempt counts")

		// Stopping a cancels its handler; its failed write never reaches
		// the database (it gives up after its retries).
		require.NoError(t, a.stop(t))
		require.NoError(t, bp.stop(t))
		require.Equal(t, q.Succeeded(), b.row(t, id).Status)
		deliveries := b.broker.of(id)
		require.Len(t, deliveries, 2)
		require.Equal(t, []string{"a", "b"}, []string{deliveries[0].Proc, deliveries[1].Proc})
		a.requireCounters(t, map[string]int64{"leases_acquired": 1})
		bp.requireCounters(t, map[string]int64{"leases_acquired": 1, "succeeded": 1})
	})

	t.Run("HeartbeatKeepsSlowHandlerFromReclaim", func(t *testing.T) {
		t.Parallel()
		b := e2eSetup(t, q)
		id := b.enqueueN(t, 1)[0]
		t0 := b.clock.Now()
		started, release := make(chan struct{}), make(chan struct{})
		a := b.start(t, "a", func(ctx context.Context, _ leasing.Message) error {
			close(started)
			select {
			case <-release:
				return nil
			case <-ctx.Done():
				return context.Cause(ctx)
			}
		}, processor.Options{})
		<-started
		require.Equal(t, t0.Add(30*time.Second), *b.row(t, id).LeaseExpiresAt)
		bp := b.start(t, "b", e2eOK, processor.Options{})

		// Step the store clock 20s at a time, 100s in all, more than three
		// leases. Each step leaves the lease live (20s < 30s); the
		// heartbeat then renews it to store-now + 30s before the next step,
		// and b, claiming all along, finds nothing due. One step of more
		// than the lease would instead race the heartbeat against b.
		for step := range 5 {
			b.clock.Advance(20 * time.Second)
			now := b.clock.Now()
			b.waitFor(t, func() bool {
				exp := b.peek(id).LeaseExpiresAt
				return exp != nil && exp.Equal(now.Add(30*time.Second))
			}, "renewed after step %d", step)
			b.waitFor(t, bp.claimsMark()(2), "b claims twice after step %d", step)
		}
		require.Len(t, b.broker.all(), 1, "b never got the message")
		st, err := b.store.Stats(ctx)
		require.NoError(t, err)
		require.Zero(t, st.ExpiredLeases)

		close(release)
		b.waitStatus(t, id, q.Succeeded())
		require.NoError(t, a.stop(t))
		require.NoError(t, bp.stop(t))
		r := b.row(t, id)
		require.Equal(t, a.p.Owner(), r.LeaseOwner)
		require.Equal(t, int64(1), r.LeaseGeneration, "never reclaimed")
		require.Equal(t, 1, r.AttemptCount)
		a.requireCounters(t, map[string]int64{"leases_acquired": 1, "succeeded": 1})
		bp.requireCounters(t, map[string]int64{})
	})

	t.Run("RenewalFailureCancelsHandlerAndMessageIsRetried", func(t *testing.T) {
		t.Parallel()
		b := e2eSetup(t, q)
		id := b.enqueueN(t, 1)[0]
		started, release := make(chan struct{}), make(chan struct{})
		cause := make(chan error, 1)
		// One slot, held until release even after the cancel: a cannot
		// claim the message back itself, so someone else must retry it.
		a := b.start(t, "a", func(ctx context.Context, _ leasing.Message) error {
			close(started)
			<-ctx.Done()
			cause <- context.Cause(ctx)
			<-release
			return nil // claims success; a must not write it
		}, processor.Options{Concurrency: 1})
		<-started
		bp := b.start(t, "b", e2eOK, processor.Options{})

		// The store clock jumps past the lease before a's heartbeat renews
		// it (a stalled heartbeat, a paused VM): the next renew is refused.
		b.clock.Advance(31 * time.Second)
		select {
		case err := <-cause:
			require.ErrorIs(t, err, leasing.ErrLeaseLost)
		case <-time.After(e2eWait):
			t.Fatal("handler context not cancelled after its lease was lost")
		}
		b.waitStatus(t, id, q.Succeeded())
		require.Equal(t, bp.p.Owner(), b.row(t, id).LeaseOwner, "b retried and finished it")

		close(release)
		b.waitFor(t, func() bool { return a.counter("persist_skipped") == 1 }, "a skips its outcome")
		require.NoError(t, a.stop(t))
		require.NoError(t, bp.stop(t))
		r := b.row(t, id)
		require.Equal(t, q.Succeeded(), r.Status)
		require.Equal(t, bp.p.Owner(), r.LeaseOwner)
		require.Equal(t, int64(2), r.LeaseGeneration)
		require.Equal(t, 2, r.AttemptCount)
		a.requireCounters(t, map[string]int64{"leases_acquired": 1, "lease_lost": 1, "persist_skipped": 1})
		bp.requireCounters(t, map[string]int64{"leases_acquired": 1, "succeeded": 1})
	})

	t.Run("FenceRefusesWriteAfterReclaim", func(t *testing.T) {
		t.Parallel()
		b := e2eSetup(t, q)
		id := b.enqueueN(t, 1)[0]
		started, release := make(chan struct{}), make(chan struct{})
		// The heartbeat never ticks during the case, so a does not learn
		// that its lease expired and was reclaimed before it writes.
		a := b.start(t, "a", func(context.Context, leasing.Message) error {
			close(started)
			<-release
			return nil
		}, processor.Options{Concurrency: 1, HeartbeatInterval: 15 * time.Second})
		<-started
		b.clock.Advance(31 * time.Second)
		other := b.rawClaim(t, "other", 10)
		require.Len(t, other, 1)
		require.Equal(t, int64(2), other[0].Generation)

		close(release)
		b.waitFor(t, func() bool { return a.counter("persist_rejected") == 1 }, "a's success write refused")
		r := b.row(t, id)
		require.Equal(t, q.InFlight(), r.Status, "a's late success did not finish the message")
		require.Equal(t, "other", r.LeaseOwner)
		require.Equal(t, int64(2), r.LeaseGeneration)
		wr, err := b.store.Complete(ctx, other...)
		require.NoError(t, err)
		require.NoError(t, wr.Err(), "the new owner finishes it")
		require.NoError(t, a.stop(t))
		a.requireCounters(t, map[string]int64{"leases_acquired": 1, "persist_rejected": 1})
	})

	t.Run("ShutdownReleasesUnstartedLeasesAtOnce", func(t *testing.T) {
		t.Parallel()
		b := e2eSetup(t, q)
		ids := b.enqueueN(t, 3)
		started, release := make(chan struct{}), make(chan struct{})
		a := b.start(t, "a", func(context.Context, leasing.Message) error {
			close(started)
			<-release
			return nil
		}, processor.Options{Concurrency: 1, BatchSize: 5, ShutdownGrace: e2eWait})
		<-started
		b.waitFor(t, func() bool { return a.counter("leases_acquired") == 3 }, "a claims all three")
		for _, id := range ids[1:] {
			r := b.row(t, id)
			require.Equal(t, q.InFlight(), r.Status, "waiting for a slot, yet leased")
			require.Equal(t, 1, r.AttemptCount)
		}

		stopped := make(chan error, 1)
		go func() { stopped <- a.p.Stop(context.Background()) }()
		// a's running handler still holds its slot; the two leases whose
		// handler never started are released at once, not at expiry.
		for _, id := range ids[1:] {
			b.waitStatus(t, id, leasing.StatusPending)
			r := b.row(t, id)
			require.Zero(t, r.AttemptCount, "a release gives the attempt back")
			require.Empty(t, r.LeaseOwner)
			require.Nil(t, r.LeaseExpiresAt)
		}
		// The store clock never moves: b takes them over without waiting
		// for any lease to expire, while a is still shutting down.
		bp := b.start(t, "b", e2eOK, processor.Options{})
		for _, id := range ids[1:] {
			b.waitStatus(t, id, q.Succeeded())
		}
		select {
		case err := <-stopped:
			t.Fatalf("a stopped (%v) before its running handler returned", err)
		default:
		}
		close(release)
		require.NoError(t, <-stopped)
		require.NoError(t, a.stop(t))
		require.NoError(t, bp.stop(t))

		r := b.row(t, ids[0])
		require.Equal(t, q.Succeeded(), r.Status, "a's running handler finished within the grace period")
		require.Equal(t, a.p.Owner(), r.LeaseOwner)
		for _, id := range ids[1:] {
			r := b.row(t, id)
			require.Equal(t, bp.p.Owner(), r.LeaseOwner)
			require.Equal(t, 1, r.AttemptCount, "the release burned no attempt")
			require.Equal(t, int64(2), r.LeaseGeneration)
			require.Len(t, b.broker.of(id), 1, "never delivered by a")
		}
		a.requireCounters(t, map[string]int64{"leases_acquired": 3, "succeeded": 1})
		bp.requireCounters(t, map[string]int64{"leases_acquired": 2, "succeeded": 2})
	})

	t.Run("TwoProcessorsClaimDisjointSubsets", func(t *testing.T) {
		t.Parallel()
		b := e2eSetup(t, q)
		ids := b.enqueueN(t, 100)
		slow := func(ctx context.Context, _ leasing.Message) error {
			time.Sleep(time.Millisecond)
			return nil
		}
		procs := []*e2eProc{
			b.newProc(t, "a", slow, processor.Options{BatchSize: 10}),
			b.newProc(t, "b", slow, processor.Options{BatchSize: 10}),
		}
		// Warm both pools so that neither starts late on a new connection,
		// then start both at the same moment.
		for _, pr := range procs {
			_, err := pr.store.Stats(ctx)
			require.NoError(t, err)
		}
		var parked sync.WaitGroup
		gate := make(chan struct{})
		for _, pr := range procs {
			pr.runAfter(gate, &parked)
		}
		parked.Wait()
		close(gate)
		for _, id := range ids {
			b.waitStatus(t, id, q.Succeeded())
		}
		for _, pr := range procs {
			require.NoError(t, pr.stop(t))
		}

		// The clock is pinned, so no lease can expire: any message claimed
		// twice would be a double claim.
		claimedBy := map[uuid.UUID]string{}
		for _, pr := range procs {
			batches := pr.store.claimed()
			require.NotEmpty(t, batches, "processor %s claimed nothing", pr.label)
			require.Len(t, batches[0], 10, "processor %s: the first claim takes a full batch", pr.label)
			n := 0
			for _, batch := range batches {
				require.LessOrEqual(t, len(batch), 10)
				for _, id := range batch {
					other, twice := claimedBy[id]
					require.False(t, twice, "message %s claimed by %s and %s", id, other, pr.label)
					claimedBy[id] = pr.label
					n++
				}
			}
			t.Logf("%s: processor %s claimed %d messages in %d batches", q, pr.label, n, len(batches))
			pr.requireCounters(t, map[string]int64{"leases_acquired": int64(n), "succeeded": int64(n)})
		}
		require.Len(t, claimedBy, len(ids), "every message claimed exactly once")

		deliveries := b.broker.all()
		require.Len(t, deliveries, len(ids), "every message delivered exactly once")
		for _, d := range deliveries {
			require.Equal(t, claimedBy[d.MessageID], d.Proc, "delivered by the processor that claimed it")
		}
		for i, pr := range procs {
			for _, id := range ids {
				if claimedBy[id] == pr.label {
					r := b.row(t, id)
					require.Equal(t, procs[i].p.Owner(), r.LeaseOwner)
					require.Equal(t, 1, r.AttemptCount)
					require.Equal(t, int64(1), r.LeaseGeneration)
				}
			}
		}
	})

	t.Run("MetricsCountersAndQueueGauges", func(t *testing.T) {
		t.Parallel()
		b := e2eSetup(t, q)
		types := []string{"ok", "ok", "flaky", "poison", "stuck"}
		msgs := make([]leasing.NewMessage, len(types))
		for i, typ := range types {
			msgs[i].Type = typ
		}
		ids := b.enqueue(t, msgs...)
		okIDs, flaky, poison, stuck := ids[:2], ids[2], ids[3], ids[4]

		var mu sync.Mutex
		calls := map[uuid.UUID]int{}
		stuckStarted := make(chan struct{})
		p := b.newProc(t, "a", func(ctx context.Context, m leasing.Message) error {
			mu.Lock()
			calls[m.ID]++
			n := calls[m.ID]
			mu.Unlock()
			switch {
			case m.Type == "flaky" && n == 1, m.Type == "poison":
				return fmt.Errorf("%s, call %d", m.Type, n)
			case m.Type == "stuck" && n == 1:
				close(stuckStarted)
				<-ctx.Done() // until its lease is lost
				return context.Cause(ctx)
			}
			return nil
		}, processor.Options{Concurrency: 8, RetryPolicy: processor.RetryPolicy{MaxAttempts: 2, InitialDelay: time.Second}})
		reg, err := processor.RegisterQueueGauges(p.provider.Meter("e2e-gauges"), b.store)
		require.NoError(t, err)
		defer func() { require.NoError(t, reg.Unregister()) }()

		// Nothing is counted before the first claim.
		p.requireCounters(t, map[string]int64{})
		p.run()

		// 1: two succeed, flaky and poison fail, stuck runs.
		<-stuckStarted
		for _, id := range okIDs {
			b.waitStatus(t, id, q.Succeeded())
		}
		b.waitStatus(t, flaky, leasing.StatusFailed)
		b.waitStatus(t, poison, leasing.StatusFailed)
		// A row's outcome commits before the processor counts it.
		p.waitCounters(t, map[string]int64{"leases_acquired": 5, "succeeded": 2, "failed": 2})
		depth, expired := e2eGauges(t, p.collect(t), q)
		require.Equal(t, e2eDepth(q, map[leasing.Status]int64{q.Succeeded(): 2, leasing.StatusFailed: 2, q.InFlight(): 1}), depth)
		require.Zero(t, expired)

		// 2: after the backoff flaky succeeds and poison, on its last
		// attempt, is dead-lettered.
		b.clock.Advance(time.Second)
		b.waitStatus(t, flaky, q.Succeeded())
		b.waitStatus(t, poison, leasing.StatusDeadLettered)
		p.waitCounters(t, map[string]int64{"leases_acquired": 7, "succeeded": 3, "failed": 2, "dead_lettered": 1})
		depth, _ = e2eGauges(t, p.collect(t), q)
		require.Equal(t, e2eDepth(q, map[leasing.Status]int64{q.Succeeded(): 3, leasing.StatusDeadLettered: 1, q.InFlight(): 1}), depth)

		// 3: the store clock jumps past stuck's lease: it is lost (its
		// handler cancelled, its outcome skipped), then reclaimed and
		// handled again.
		b.clock.Advance(31 * time.Second)
		b.waitStatus(t, stuck, q.Succeeded())
		b.waitFor(t, func() bool { return p.counter("persist_skipped") == 1 }, "stuck's first outcome skipped")
		require.NoError(t, p.stop(t))
		p.requireCounters(t, map[string]int64{
			"leases_acquired": 8, "succeeded": 4, "failed": 2, "dead_lettered": 1, "lease_lost": 1, "persist_skipped": 1,
		})
		depth, expired = e2eGauges(t, p.collect(t), q)
		require.Equal(t, e2eDepth(q, map[leasing.Status]int64{q.Succeeded(): 4, leasing.StatusDeadLettered: 1}), depth)
		require.Zero(t, expired)
		require.Equal(t, 2, b.row(t, stuck).AttemptCount)
	})

	t.Run("TenantScoping", func(t *testing.T) {
		t.Parallel()
		b := e2eSetup(t, q)
		var msgs []leasing.NewMessage
		for _, tenant := range []string{"a", "b", "", "a", "b", "", "a", "b"} {
			msgs = append(msgs, leasing.NewMessage{TenantID: tenant})
		}
		ids := b.enqueue(t, msgs...)
		byTenant := map[string][]uuid.UUID{}
		for i, m := range msgs {
			byTenant[m.TenantID] = append(byTenant[m.TenantID], ids[i])
		}

		// Each tenant's processor takes that tenant's messages only; the
		// untenanted ones are left to a processor without a tenant, which
		// runs last.
		order := []string{"a", "b", ""}
		for i, tenant := range order {
			p := b.start(t, "tenant-"+tenant, e2eOK, processor.Options{TenantID: tenant})
			for _, id := range byTenant[tenant] {
				b.waitStatus(t, id, q.Succeeded())
			}
			b.waitFor(t, p.claimsMark()(3), "three more claims")
			require.NoError(t, p.stop(t))
			p.requireCounters(t, map[string]int64{
				"leases_acquired": int64(len(byTenant[tenant])), "succeeded": int64(len(byTenant[tenant])),
			})
			for _, d := range b.broker.all() {
				if d.Proc == p.label {
					require.Equal(t, tenant, d.TenantID, "processor %s handled another tenant's message", p.label)
				}
			}
			for _, later := range order[i+1:] {
				for _, id := range byTenant[later] {
					r := b.row(t, id)
					require.Equal(t, leasing.StatusPending, r.Status)
					require.Zero(t, r.LeaseGeneration, "tenant %q's message claimed by processor %s", later, p.label)
				}
			}
		}
		require.Len(t, b.broker.all(), len(ids), "each message delivered once")
	})
}
