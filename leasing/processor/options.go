package processor

import (
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/leasestore/leasestore/leasing"
)

// Processor defaults, used for zero Options fields.
const (
	DefaultBatchSize     = 10
	DefaultLeaseDuration = 30 * time.Second
	DefaultConcurrency   = 4
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
	// told apart. UTF-8 without NUL, at most leasing.MaxOwnerLabelBytes
	// bytes. Defaults to the queue name.
	Owner string
	// TenantID, when not empty, claims only that tenant's messages.
	// UTF-8 without NUL.
	TenantID string
	// BatchSize is the most messages one claim takes,
	// 1..leasing.MaxBatchSize, and so the most leases one BatchHandler
	// call receives (NewBatch). Defaults to 10.
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
	// 1..MaxConcurrency. Defaults to 4.
	Concurrency int
	// PollInterval is the longest wait between two claims while slots are
	// free and the last claim found too few due messages, > 0: a message
	// due while no signal arrives is claimed within it. Without a
	// WorkSignal the processor claims every PollInterval. With one it is
	// the ceiling the polling backs off to: the processor claims again 2
	// ms after a claim that found work (a row that commits just after a
	// wake may have no notification of its own; see migration 00009),
	// doubling the wait while claims find nothing, 2, 4, ... 64 ms (126
	// ms in all), then every PollInterval until a wake. An idle processor
	// thus sends one claim per PollInterval. Defaults to 1 second, or
	// DefaultSignalledPollInterval (10 seconds) with a WorkSignal.
	PollInterval time.Duration
	// RetryPolicy decides the retry delay after a handler error and when
	// to dead-letter. Defaults to the zero RetryPolicy (5 attempts, 1s
	// doubling up to 5 minutes).
	RetryPolicy RetryPolicy
	// HandlerTimeout is how long one handler call may run, on the
	// processor's clock from the moment its worker starts it, > 0 or
	// NoHandlerTimeout (no limit). Past it the handler's context is
	// cancelled with cause ErrHandlerTimeout and, at once, without waiting
	// for the handler to return, the attempt is written as failed (due
	// again after RetryPolicy.Backoff) or dead_lettered per the
	// RetryPolicy, with ErrHandlerTimeout's text and the timeout: the lease
	// is no longer renewed, and whatever the handler returns later is not
	// written. A handler that ignores its context keeps its worker slot
	// until it returns, and may then run beside a retry of its message.
	// Keep it above the longest handler call you expect; set
	// NoHandlerTimeout for handlers that must run longer (their leases are
	// renewed for as long as they run). Defaults to 1 minute.
	HandlerTimeout time.Duration
	// ShutdownGrace is how long running handlers may go on after shutdown
	// starts before their contexts are cancelled, > 0. Defaults to 10
	// seconds.
	ShutdownGrace time.Duration
	// Meter receives the processor counters (see the package
	// documentation). nil records nothing.
	Meter metric.Meter
	// TracerProvider, when not nil, traces the processor (see the package
	// documentation, Tracing): a "process <queue>" span per handled
	// message, linked to the trace context its enqueue stored in its
	// headers (leasing.PostgresOptions.TracerProvider) and carried by the
	// handler's context, and a span per claim that took or parked
	// messages or failed (an idle poll traces nothing), per renew and per
	// outcome write. nil, the default, starts no span.
	TracerProvider trace.TracerProvider
	// Logger, when not nil, receives the processor's structured events
	// (see the package documentation, Logging), each with the attributes
	// queue and owner. nil, the default, logs nothing: a library should not
	// write to a program's log unasked, and OnError already receives every
	// error; pass slog.Default() to log to the program's default logger.
	// A successful message logs nothing at info or above.
	Logger *slog.Logger
	// WorkSignal, when not nil, wakes the processor to claim before the
	// poll interval ends.
	WorkSignal WorkSignal
	// OnError, when not nil, receives the errors the processor handles by
	// trying again later: claim, renew and outcome-write failures, claims
	// that parked messages (a *leasing.ParkedError; the claim's leases are
	// worked), and
	// vacuum policy failures (leasing.ErrVacuumNotAllowed once, when the
	// user may not VACUUM the tables). It may be called from several
	// goroutines at once and must not block.
	OnError func(error)
	// Vacuum is the policy by which the processor vacuums its queue's
	// table and its ordering keys' table while it runs, on a store that is
	// a Vacuumer (*leasing.Postgres; see KeepVacuumed): every processor of
	// a queue may run it, at most one VACUUM of a table runs at a time.
	// The zero value is on, with the defaults; set Disabled to leave the
	// tables to autovacuum.
	Vacuum VacuumPolicy
}

// resolve returns o with defaults filled in for queue q, and the claim
// request the processor sends, its owner made from o.Owner. The claim's
// fields are checked by leasing.ClaimRequest.Validate.
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
	if err := leasing.ValidateOwnerLabel(o.Owner); err != nil {
		return o, claim, err
	}
	claim = leasing.ClaimRequest{
		Owner: leasing.NewOwner(o.Owner), BatchSize: o.BatchSize, LeaseFor: o.LeaseDuration, TenantID: o.TenantID,
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
		if o.WorkSignal != nil {
			o.PollInterval = DefaultSignalledPollInterval
		}
	}
	if err := leasing.ValidatePositive("poll interval", o.PollInterval); err != nil {
		return o, claim, err
	}
	var err error
	if o.Vacuum, err = o.Vacuum.resolve(); err != nil {
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
