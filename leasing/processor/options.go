package processor

import (
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/leasestore/leasestore/leasing"
)

// Processor defaults, used for zero Options fields.
const (
	// DefaultBatchSize and DefaultConcurrency fit a relay (a handler of a
	// broker call or less): 64 slots fed by claims of 100 drained 3.3-3.5x
	// what 4 slots and claims of 10 did, in each of 3 rounds, and are the
	// settings the pickup latency figures are measured with
	// (docs/notes/2026-12-04-processor-speed.md).
	DefaultBatchSize     = 100
	DefaultLeaseDuration = 30 * time.Second
	DefaultConcurrency   = 64
	DefaultPollInterval  = time.Second
	// DefaultSignalledPollInterval is the PollInterval of Options with a
	// WorkSignal and no PollInterval: the signal wakes the processor, the
	// poll only covers what the signal missed.
	DefaultSignalledPollInterval = 10 * time.Second
	DefaultShutdownGrace         = 10 * time.Second
	// DefaultHandlerTimeout is the HandlerTimeout of zero Options.
	DefaultHandlerTimeout = time.Minute
)

// NoHandlerTimeout as Options.HandlerTimeout lets handlers run for as long
// as they take: their leases are renewed until they return.
const NoHandlerTimeout time.Duration = -1

// MaxConcurrency is the most worker slots a Processor takes.
const MaxConcurrency = 10_000

// Options configures a Processor. The zero value of each field takes its
// documented default; negative values are rejected (but NoHandlerTimeout).
type Options struct {
	// Owner is the lease owner label; New appends a random suffix
	// (leasing.NewOwner) so that processes started with the same label are
	// told apart. UTF-8 without NUL and without "@", which separates it
	// from InstanceID in an instance's label, at most
	// leasing.MaxOwnerLabelBytes bytes. Defaults to the queue name.
	Owner string
	// TenantID, when not empty, claims only that tenant's messages.
	// UTF-8 without NUL.
	TenantID string
	// Topics, when not empty, makes a topic-scoped processor: it claims
	// only messages of these topics (the outbox's Topic, the inbox's
	// message Type), in FIFO order within them (leasing.ClaimRequest.Topics,
	// with its limits). Run one processor per destination so that a
	// destination that is down stalls only its own topics.
	Topics []string
	// BatchSize is the most messages one claim takes,
	// 1..leasing.MaxBatchSize, and so the most leases one BatchHandler
	// call receives (NewBatch). Defaults to 100.
	BatchSize int
	// LeaseDuration is how long each claim and renew holds a message, from
	// the store's now, 1µs..leasing.MaxLeaseDuration. Defaults to 30
	// seconds.
	LeaseDuration time.Duration
	// HeartbeatInterval is the time between two renews of the processor's
	// leases, > 0 and at most LeaseDuration/2. Defaults to LeaseDuration/3.
	HeartbeatInterval time.Duration
	// Concurrency is the number of worker slots, that is of handler calls
	// running at once (each of up to BatchSize leases for NewBatch),
	// 1..MaxConcurrency. Defaults to 64.
	Concurrency int
	// MergeCompletions sends, while the processor drains a backlog (its
	// last claim took a full batch), the completions of unkeyed messages
	// with its next claim: one call and one commit for both, on a
	// CompleteClaimer store (leasing.Postgres, leasing.Memory; ignored on
	// others). A completion waits at most 50 ms for a claim. It saves the
	// database a transaction per batch: worth it where several processors
	// share a busy database (4 processors x 100 slots with a 1 ms handler
	// drained 5-14% faster with it, about as fast with a no-op one); a lone
	// processor drained 10-25% slower, as its claim loop then writes what
	// its writer would write meanwhile on a connection of its own
	// (docs/notes/2026-12-04-processor-speed.md). Default false.
	MergeCompletions bool
	// PollInterval is the longest wait between two claims while slots are
	// free and the last claim found too few due messages, > 0. With a
	// WorkSignal it is the ceiling: the processor claims again 2, 4, ...
	// 64 ms after a claim that found work (docs/processor.md, Work signal).
	// Defaults to 1 second, or DefaultSignalledPollInterval with a
	// WorkSignal.
	PollInterval time.Duration
	// RetryPolicy decides the retry delay after a handler error and when
	// to dead-letter. Defaults to the zero RetryPolicy.
	RetryPolicy RetryPolicy
	// HandlerTimeout bounds one handler call, > 0: past it the call's
	// context is cancelled (ErrHandlerTimeout) and its attempt is written
	// failed at once. NoHandlerTimeout lets handlers run as long as they
	// take. Defaults to 1 minute.
	HandlerTimeout time.Duration
	// ShutdownGrace is how long running handlers may go on once shutdown
	// starts before their contexts are cancelled, > 0. Defaults to 10
	// seconds.
	ShutdownGrace time.Duration
	// Meter receives the processor's metrics (docs/processor.md lists
	// them); nil, the default, records nothing.
	Meter metric.Meter
	// TracerProvider starts the processor's spans; nil starts none.
	TracerProvider trace.TracerProvider
	// Logger receives the processor's log records, each with queue and
	// owner; nil, the default, logs nothing (pass slog.Default() for the
	// program's log).
	Logger *slog.Logger
	// WorkSignal, when not nil, wakes the processor to claim before the
	// poll interval ends.
	WorkSignal WorkSignal
	// OnError, when not nil, receives the errors the processor handles by
	// trying again later (claim, renew, outcome write, orphan sweep,
	// privilege check, vacuum, listener, instance lock, retention; a
	// schema behind once per finding), each
	// *leasing.ParkedError of a claim, and the refusal Run returns. It
	// may be called from several goroutines at once and must not block.
	OnError func(error)
	// Vacuum is the policy by which the processor vacuums its queue's
	// tables on a Vacuumer store. The zero value is on, with the defaults.
	Vacuum VacuumPolicy
	// FailOnSchemaBehind makes Run return the *leasing.SchemaError (after
	// shutting down) when the database lacks migrations this version
	// needs; by default the processor waits for the migration, in
	// StateSchemaBehind, checking again every PollInterval.
	FailOnSchemaBehind bool
	// DirectConfig, when not nil, is a connection config that reaches
	// PostgreSQL directly, not through a transaction-mode pooler
	// (pool.Config().ConnConfig when the pool does). The processor then
	// runs its own leasing.Listener on it as its WorkSignal, unless
	// WorkSignal is set, with its errors reported to OnError and in
	// Health; and, with InstanceID, holds the instance's identity on it.
	// The store must be a *leasing.Postgres.
	DirectConfig *pgx.ConnConfig
	// InstanceID, when not empty, is the processor's stable identity, the
	// same across restarts of one instance (a StatefulSet pod's name, a
	// host name plus a slot): the lease owner becomes
	// leasing.NewOwner(Owner + "@" + InstanceID), still one per run.
	// Before its first claim Run takes the identity (leasing.LockInstance
	// on DirectConfig, which InstanceID needs), refusing with a
	// *leasing.InstanceInUseError when another live process holds it,
	// and ends the leases its earlier incarnations left
	// (leasing.Postgres.ExpirePrevious), so that a restart reclaims them
	// at once instead of after their expiry (docs/processor.md, Instance
	// identity). UTF-8 without NUL; Owner + "@" + InstanceID at most
	// leasing.MaxOwnerLabelBytes bytes.
	InstanceID string
	// Retention, when not the zero value, has the processor apply the
	// policy to its queue every Retention.Interval
	// (leasing.Postgres.PurgeRetention: one runner at a time per queue,
	// whichever processor gets the turn). The store must be a Retainer
	// and its role may DELETE (leasestore_operator); else schedule
	// leasectl purge. On the inbox Retention.Finished is the dedup window
	// (docs/operations.md, Retention).
	Retention leasing.RetentionPolicy
	// Breaker is the policy of the breaker that stops claims while
	// handlers report their destination Unavailable (docs/processor.md,
	// Outages). The zero value is on, with the defaults.
	Breaker BreakerPolicy
}

// instanceLabel returns the owner label of a processor with an
// InstanceID.
func (o Options) instanceLabel() string { return o.Owner + "@" + o.InstanceID }

// resolve returns o with defaults filled in for queue q, and the claim
// request the processor sends.
//
// Errors: a *leasing.ArgumentError naming the first bad option.
func (o Options) resolve(q leasing.Queue) (Options, leasing.ClaimRequest, error) {
	if o.Owner == "" {
		o.Owner = string(q)
	}
	if o.BatchSize == 0 {
		o.BatchSize = DefaultBatchSize
	}
	if o.LeaseDuration == 0 {
		o.LeaseDuration = DefaultLeaseDuration
	}
	var claim leasing.ClaimRequest
	if strings.Contains(o.Owner, "@") {
		// An owner "relay@a" would make the leases of its runs those of an
		// instance "a" of "relay", which that instance's start expires.
		return o, claim, argumentError("owner", "must not hold \"@\", which separates Owner from InstanceID; got %q", o.Owner)
	}
	label := o.Owner
	if o.InstanceID != "" {
		if o.DirectConfig == nil {
			return o, claim, argumentError("instance id", "needs DirectConfig, a direct connection to hold the identity on")
		}
		label = o.instanceLabel()
	}
	if err := leasing.ValidateOwnerLabel(label); err != nil {
		return o, claim, err
	}
	claim = leasing.ClaimRequest{
		Owner: leasing.NewOwner(label), BatchSize: o.BatchSize, LeaseFor: o.LeaseDuration, TenantID: o.TenantID,
		Topics: slices.Clone(o.Topics),
	}
	if err := claim.Validate(); err != nil {
		return o, claim, err
	}
	if o.HeartbeatInterval == 0 {
		o.HeartbeatInterval = o.LeaseDuration / 3
	}
	if o.HeartbeatInterval <= 0 || o.HeartbeatInterval > o.LeaseDuration/2 {
		return o, claim, argumentError("heartbeat interval", "must be > 0 and at most half the lease duration %s, got %s",
			o.LeaseDuration, o.HeartbeatInterval)
	}
	if o.Concurrency == 0 {
		o.Concurrency = DefaultConcurrency
	}
	if o.Concurrency < 1 || o.Concurrency > MaxConcurrency {
		return o, claim, argumentError("concurrency", "must be 1..%d, got %d", MaxConcurrency, o.Concurrency)
	}
	if o.PollInterval == 0 {
		o.PollInterval = DefaultPollInterval
		if o.WorkSignal != nil || o.DirectConfig != nil {
			o.PollInterval = DefaultSignalledPollInterval
		}
	}
	if err := leasing.ValidatePositive("poll interval", o.PollInterval); err != nil {
		return o, claim, err
	}
	var err error
	if o.retains() {
		if o.Retention, err = o.Retention.Resolve(); err != nil {
			return o, claim, err
		}
	}
	if o.Vacuum, err = o.Vacuum.resolve(); err != nil {
		return o, claim, err
	}
	if o.Breaker, err = o.Breaker.resolve(); err != nil {
		return o, claim, err
	}
	o.RetryPolicy = o.RetryPolicy.withDefaults()
	if err := o.RetryPolicy.validate(); err != nil {
		return o, claim, err
	}
	if o.HandlerTimeout == 0 {
		o.HandlerTimeout = DefaultHandlerTimeout
	}
	if o.HandlerTimeout < 0 && o.HandlerTimeout != NoHandlerTimeout {
		return o, claim, argumentError("handler timeout", "must be > 0, or NoHandlerTimeout (-1ns) for none, got %s", o.HandlerTimeout)
	}
	if o.ShutdownGrace == 0 {
		o.ShutdownGrace = DefaultShutdownGrace
	}
	if err := leasing.ValidatePositive("shutdown grace", o.ShutdownGrace); err != nil {
		return o, claim, err
	}
	return o, claim, nil
}
