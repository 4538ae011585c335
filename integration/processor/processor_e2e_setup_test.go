package processor_test

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

	"github.com/leasestore/leasestore/internal/dbtest"
	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/leasingtest"
	"github.com/leasestore/leasestore/leasing/processor"
)

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
	batches [][]uuid.UUID     // ids of each non-empty claim, in claim order
	renews  int               // Renew calls
	renewed map[uuid.UUID]int // Renew calls that carried each message
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
	s.mu.Lock()
	s.renews++
	if s.renewed == nil {
		s.renewed = map[uuid.UUID]int{}
	}
	for _, l := range leases {
		s.renewed[l.Message.ID]++
	}
	s.mu.Unlock()
	return s.Store.Renew(ctx, d, leases...)
}

// renewCounts returns how many Renew calls were sent, and how many of them
// carried message id.
func (s *e2eStore) renewCounts(id uuid.UUID) (calls, carried int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.renews, s.renewed[id]
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

func (b *e2eBundle) start(t *testing.T, label string, behave e2eBehaviour, opts processor.Options) *e2eProc {
	t.Helper()
	pr := b.newProc(t, label, behave, opts)
	pr.run()
	return pr
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

// e2eCounterNames are the processor counters, as the processor package names them
// and the seed, with "succeeded" standing for the outbox's "published".
var e2eCounterNames = []string{
	"leases_acquired", "succeeded", "failed", "dead_lettered", "lease_lost", "persist_skipped", "persist_rejected", "parked",
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
