package leasing

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/metric"

	"github.com/leasestore/leasestore/gen"
	"github.com/leasestore/leasestore/internal/wait"
)

// Listener defaults, used for zero ListenerOptions fields.
const (
	DefaultListenerMinBackoff = 100 * time.Millisecond
	DefaultListenerMaxBackoff = 30 * time.Second
	DefaultListenerProbeWait  = 5 * time.Second
	// DefaultListenerHeartbeatInterval is how long a connection may stay
	// silent before the Listener probes it.
	DefaultListenerHeartbeatInterval = 10 * time.Second
	// DefaultListenerHeartbeatTimeout bounds one heartbeat probe.
	DefaultListenerHeartbeatTimeout = 5 * time.Second
)

const (
	// listenerProbePrefix starts the payload of the notification a Listener
	// sends itself after each LISTEN; a random suffix tells its own apart.
	listenerProbePrefix  = "leasestore-listener-probe:"
	listenerCloseTimeout = 5 * time.Second
)

// ListenerOptions configures a Listener. The zero value of each field
// takes its documented default.
type ListenerOptions struct {
	// MinBackoff is the wait before the first reconnect, > 0; it doubles
	// after each failed try. Defaults to 100 milliseconds.
	MinBackoff time.Duration
	// MaxBackoff caps the reconnect wait, >= MinBackoff. Defaults to 30
	// seconds.
	MaxBackoff time.Duration
	// ProbeWait is how long the listener waits, after each LISTEN, for the
	// notification it sends itself from a second connection, > 0.
	// Defaults to 5 seconds.
	ProbeWait time.Duration
	// HeartbeatInterval is how long the connection may stay silent (no
	// notification, no reply) before the listener probes it with an empty
	// query, > 0. Defaults to DefaultListenerHeartbeatInterval.
	HeartbeatInterval time.Duration
	// HeartbeatTimeout bounds that probe, > 0: a connection that does not
	// answer within it is half-open (a failover behind a proxy, a dropped
	// NAT entry) and the listener reconnects. A dead connection is thus
	// noticed within HeartbeatInterval + HeartbeatTimeout. Defaults to
	// DefaultListenerHeartbeatTimeout.
	HeartbeatTimeout time.Duration
	// Meter, when not nil, receives the listener's metrics
	// (docs/observability.md): litebus.<queue>.listener.healthy, a gauge
	// of 1 while Healthy and 0 otherwise, and the counters
	// litebus.<queue>.listener.reconnects (connections lost) and
	// litebus.<queue>.listener.heartbeat_failures (probes that failed).
	Meter metric.Meter
	// OnError, when not nil, receives connection errors before each
	// reconnect wait, and the *ListenerUndeliveredError before Run returns
	// it. It is called from Run's goroutine.
	OnError func(error)
	// Logger, when not nil, receives the listener's events, each with the
	// attributes queue and channel: "listener connected" (info),
	// "listener connection lost; reconnecting" (warn, with error and
	// backoff) and "listener stopped: notifications do not arrive"
	// (error). nil, the default, logs nothing.
	Logger *slog.Logger
}

// ListenerUndeliveredError is what Listener.Run returns when LISTEN
// succeeded but its own probe notification did not arrive within
// ListenerOptions.ProbeWait. A transaction-mode pooler (PgBouncer,
// Supavisor, RDS Proxy, a pooled Neon endpoint) does that: connect the
// Listener to PostgreSQL itself.
type ListenerUndeliveredError struct {
	Channel string        // the channel LISTENed on
	Waited  time.Duration // how long the listener waited
}

// Error says what did not arrive and what to do.
func (e *ListenerUndeliveredError) Error() string {
	return fmt.Sprintf("leasing: LISTEN on %s succeeded but a notification sent to it did not arrive within %s; "+
		"the connection cannot deliver notifications (a transaction-mode pooler?): connect the Listener to PostgreSQL directly",
		e.Channel, e.Waited)
}

// Listener wakes a processor (it is a processor.WorkSignal) on every
// notification of a queue's NOTIFY channel, which the insert trigger
// (migration 00009) signals at most about once per 10 ms per table, as do
// the calls that make rows due at once: Release, ReleaseAfter without a
// delay, Requeue, RequeueAll, ReleaseOrphans and ExpirePrevious. It
// LISTENs over a dedicated connection that must reach PostgreSQL directly:
// after each LISTEN it sends itself a probe from a second connection and
// stops with a *ListenerUndeliveredError when the probe does not come back
// (every listener of the channel wakes once for it). Wakes coalesce: the
// channel holds at most one. After a broken connection Run reconnects with
// capped exponential backoff and wakes once, since rows may have arrived
// meanwhile. Give each processor its own Listener: one wake reaches one
// receiver. docs/operations.md covers poolers.
//
// While connected it probes a connection that stayed silent for
// ListenerOptions.HeartbeatInterval and reconnects when the probe is not
// answered within HeartbeatTimeout, so a half-open connection, on which
// notifications would never arrive, is noticed within their sum. Healthy
// and LastHeard report it (docs/high-availability.md).
type Listener struct {
	config    *pgx.ConnConfig
	queue     Queue
	opts      ListenerOptions
	log       *slog.Logger // opts.Logger with queue and channel; nil logs nothing
	wake      chan struct{}
	pid       atomic.Uint32
	running   atomic.Bool
	lastHeard atomic.Int64 // unix nanoseconds of the last message from the server; 0 before the first
	metrics   listenerMetrics
}

// listenerMetrics are a Listener's counters; nil without a Meter.
type listenerMetrics struct {
	reconnects        metric.Int64Counter
	heartbeatFailures metric.Int64Counter
}

// NewListener returns a listener for queue q that connects with a copy of
// config and LISTENs on q.Channel(). Call Run to start it. config must
// reach PostgreSQL directly: pool.Config().ConnConfig when the pool does,
// else a config of its own (pgx.ParseConfig of the server's URL).
//
// Errors: a *ArgumentError for a nil config, an unknown queue or bad
// options.
func NewListener(config *pgx.ConnConfig, q Queue, opts ListenerOptions) (*Listener, error) {
	if config == nil {
		return nil, argumentError("connection config", "must not be nil")
	}
	if _, err := ParseQueue(string(q)); err != nil {
		return nil, err
	}
	if opts.MinBackoff == 0 {
		opts.MinBackoff = DefaultListenerMinBackoff
	}
	if opts.MaxBackoff == 0 {
		opts.MaxBackoff = max(DefaultListenerMaxBackoff, opts.MinBackoff)
	}
	if opts.MinBackoff < 0 || opts.MaxBackoff < opts.MinBackoff {
		return nil, argumentError("listener backoff", "need 0 < min <= max, got %s and %s", opts.MinBackoff, opts.MaxBackoff)
	}
	if opts.ProbeWait == 0 {
		opts.ProbeWait = DefaultListenerProbeWait
	}
	if err := ValidatePositive("listener probe wait", opts.ProbeWait); err != nil {
		return nil, err
	}
	if opts.HeartbeatInterval == 0 {
		opts.HeartbeatInterval = DefaultListenerHeartbeatInterval
	}
	if err := ValidatePositive("listener heartbeat interval", opts.HeartbeatInterval); err != nil {
		return nil, err
	}
	if opts.HeartbeatTimeout == 0 {
		opts.HeartbeatTimeout = DefaultListenerHeartbeatTimeout
	}
	if err := ValidatePositive("listener heartbeat timeout", opts.HeartbeatTimeout); err != nil {
		return nil, err
	}
	l := &Listener{config: config.Copy(), queue: q, opts: opts, wake: make(chan struct{}, 1)}
	if err := l.newMetrics(); err != nil {
		return nil, err
	}
	if opts.Logger != nil {
		l.log = opts.Logger.With(slog.String("queue", string(q)), slog.String("channel", q.Channel()))
	}
	return l, nil
}

// Wake returns the channel that receives one value after notifications
// arrived (and after each successful LISTEN). It has a buffer of one.
// Notifications that arrive while a new connection's LISTEN is checked
// wake once the check passed: BackendPID is set before any wake of that
// connection.
func (l *Listener) Wake() <-chan struct{} { return l.wake }

// Channel returns the channel name listened on.
func (l *Listener) Channel() string { return l.queue.Channel() }

// BackendPID returns the server process id of the listening connection,
// or 0 while no LISTEN is in place.
func (l *Listener) BackendPID() uint32 { return l.pid.Load() }

// LastHeard returns when, by the local clock, the listening connection
// last received something from the server: a notification, the probe
// after LISTEN or a heartbeat's reply. It is the zero time before the
// first LISTEN.
func (l *Listener) LastHeard() time.Time {
	ns := l.lastHeard.Load()
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}

// Healthy reports whether a LISTEN is in place and the connection was
// heard from within HeartbeatInterval + HeartbeatTimeout, by the local
// clock. It is false before Run connects, while it reconnects and after
// it returns.
func (l *Listener) Healthy() bool {
	if l.pid.Load() == 0 {
		return false
	}
	return time.Since(l.LastHeard()) <= l.opts.HeartbeatInterval+l.opts.HeartbeatTimeout
}

// newMetrics makes the listener's instruments on opts.Meter, if any.
func (l *Listener) newMetrics() error {
	m := l.opts.Meter
	if m == nil {
		return nil
	}
	name := func(n string) string { return "litebus." + string(l.queue) + ".listener." + n }
	var errs []error
	counter := func(n, unit, desc string) metric.Int64Counter {
		c, err := m.Int64Counter(name(n), metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	l.metrics.reconnects = counter("reconnects", "{connection}", "Listener connections lost; each is followed by a reconnect.")
	l.metrics.heartbeatFailures = counter("heartbeat_failures", "{probe}", "Heartbeat probes not answered within the heartbeat timeout.")
	healthy, err := m.Int64ObservableGauge(name("healthy"), metric.WithUnit("1"),
		metric.WithDescription("1 while the listener LISTENs and was heard from within its heartbeat bound, else 0."))
	errs = append(errs, err)
	if err == nil {
		_, err = m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
			v := int64(0)
			if l.Healthy() {
				v = 1
			}
			o.ObserveInt64(healthy, v)
			return nil
		}, healthy)
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("leasing: listener metrics: %w", err)
	}
	return nil
}

// heard records that the connection received something now.
func (l *Listener) heard() { l.lastHeard.Store(time.Now().UnixNano()) }

// Run connects, LISTENs, checks that notifications arrive and wakes on
// them until ctx is cancelled, reconnecting after every connection error;
// it then closes the connection and returns nil.
//
// Errors: an error at once when Run is already running on l; a
// *ListenerUndeliveredError, after passing it to OnError, when a
// connection accepted LISTEN but did not deliver the probe.
func (l *Listener) Run(ctx context.Context) error {
	if !l.running.CompareAndSwap(false, true) {
		return errors.New("leasing: listener already running")
	}
	defer l.running.Store(false)
	backoff := l.opts.MinBackoff
	for {
		err := l.listen(ctx, func() {
			backoff = l.opts.MinBackoff
			l.logf(slog.LevelInfo, "listener connected", slog.Int64("backend_pid", int64(l.pid.Load())))
		})
		if ctx.Err() != nil {
			return nil
		}
		if undelivered := (*ListenerUndeliveredError)(nil); errors.As(err, &undelivered) {
			l.logf(slog.LevelError, "listener stopped: notifications do not arrive", slog.String("error", err.Error()))
			l.report(err)
			return err
		}
		if l.metrics.reconnects != nil {
			l.metrics.reconnects.Add(context.WithoutCancel(ctx), 1)
		}
		l.report(fmt.Errorf("leasing: listen on %s: %w", l.Channel(), err))
		l.logf(slog.LevelWarn, "listener connection lost; reconnecting", slog.String("error", err.Error()), slog.Duration("backoff", backoff))
		if !wait.Sleep(ctx, backoff) {
			return nil
		}
		backoff = min(backoff*2, l.opts.MaxBackoff)
	}
}

func (l *Listener) report(err error) {
	if l.opts.OnError != nil {
		l.opts.OnError(err)
	}
}

func (l *Listener) logf(level slog.Level, msg string, attrs ...slog.Attr) {
	if l.log != nil {
		l.log.LogAttrs(context.Background(), level, msg, attrs...)
	}
}

// listen holds one connection until it fails or ctx ends; it calls
// connected once LISTEN is in place and delivers.
func (l *Listener) listen(ctx context.Context, connected func()) error {
	conn, err := pgx.ConnectConfig(ctx, l.config.Copy())
	if err != nil {
		return err
	}
	defer func() {
		l.pid.Store(0)
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), listenerCloseTimeout)
		defer cancel()
		_ = conn.Close(closeCtx)
	}()
	// LISTEN takes no parameters: the channel is one of two fixed names,
	// quoted as an identifier.
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{l.Channel()}.Sanitize()); err != nil {
		return err
	}
	if err := l.probe(ctx, conn); err != nil {
		return err
	}
	l.heard()
	l.pid.Store(conn.PgConn().PID())
	connected()
	l.signal()
	for {
		waitCtx, cancel := context.WithTimeout(ctx, l.opts.HeartbeatInterval)
		_, err := conn.WaitForNotification(waitCtx)
		cancel()
		switch {
		case err == nil:
			l.heard()
			l.signal()
		case ctx.Err() == nil && errors.Is(waitCtx.Err(), context.DeadlineExceeded) && !conn.IsClosed():
			if err := l.heartbeat(ctx, conn); err != nil {
				return err
			}
		default:
			return err
		}
	}
}

// heartbeat sends conn an empty query and waits HeartbeatTimeout for the
// reply. A rows-free ping is enough: the server answers it only while the
// connection works both ways.
//
// Errors: a connection error, or one that says the heartbeat was not
// answered in time.
func (l *Listener) heartbeat(ctx context.Context, conn *pgx.Conn) error {
	pingCtx, cancel := context.WithTimeout(ctx, l.opts.HeartbeatTimeout)
	defer cancel()
	if err := conn.Ping(pingCtx); err != nil {
		if ctx.Err() != nil {
			return err
		}
		if l.metrics.heartbeatFailures != nil {
			l.metrics.heartbeatFailures.Add(context.WithoutCancel(ctx), 1)
		}
		return fmt.Errorf("heartbeat not answered within %s: %w", l.opts.HeartbeatTimeout, err)
	}
	l.heard()
	return nil
}

// signal leaves one wake in the channel unless one is already there.
func (l *Listener) signal() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// probe sends the channel a notification with a payload of its own from a
// second connection and waits for it on conn, which LISTENs. A second
// connection, since a session receives its own notifications, and behind a
// transaction pooler the probe could run on the very session that ran
// LISTEN.
//
// Errors: a *ListenerUndeliveredError when the probe does not arrive
// within ProbeWait; else a connection error.
func (l *Listener) probe(ctx context.Context, conn *pgx.Conn) error {
	payload := listenerProbePrefix + rand.Text()
	sender, err := pgx.ConnectConfig(ctx, l.config.Copy())
	if err != nil {
		return err
	}
	err = gen.New().SignalProbe(ctx, sender, gen.SignalProbeParams{Channel: l.Channel(), Payload: payload})
	closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), listenerCloseTimeout)
	_ = sender.Close(closeCtx)
	cancel()
	if err != nil {
		return err
	}
	waitCtx, cancel := context.WithTimeout(ctx, l.opts.ProbeWait)
	defer cancel()
	for {
		n, err := conn.WaitForNotification(waitCtx)
		switch {
		case err != nil && ctx.Err() == nil && errors.Is(waitCtx.Err(), context.DeadlineExceeded):
			return &ListenerUndeliveredError{Channel: l.Channel(), Waited: l.opts.ProbeWait}
		case err != nil:
			return err
		case n.Payload == payload:
			return nil
		}
		// Another notification: the wake that listen sends once the
		// probe arrived covers it. Not sent now, so that Wake's receivers
		// find BackendPID set.
		l.heard()
	}
}
