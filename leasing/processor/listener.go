package processor

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/leasestore/leasestore/gen"
	"github.com/leasestore/leasestore/leasing"
)

// Listener defaults, used for zero ListenerOptions fields.
const (
	DefaultListenerMinBackoff = 100 * time.Millisecond
	DefaultListenerMaxBackoff = 30 * time.Second
	DefaultListenerProbeWait  = 5 * time.Second
)

// listenerProbePrefix starts the payload of the notification a Listener
// sends itself after each LISTEN; a random suffix tells its own apart.
const listenerProbePrefix = "leasestore-listener-probe:"

// listenerCloseTimeout bounds closing a listener connection.
const listenerCloseTimeout = 5 * time.Second

// WorkSignal wakes a Processor before its poll interval ends, e.g. a
// Listener on the queue's NOTIFY channel. Wake returns the same channel on
// every call; a receive on it makes the processor claim at once.
type WorkSignal interface {
	// Wake returns the channel whose receives wake the processor:
	// Processor.Run calls it once, then receives from the channel until Run
	// returns.
	//
	// Errors: none; Wake cannot fail, and a signal reports its own failures
	// elsewhere (Listener.Run, ListenerOptions.OnError). A channel that stops
	// delivering, or a nil one, leaves the processor claiming every
	// Options.PollInterval; a closed one wakes it once and is then ignored.
	Wake() <-chan struct{}
}

// WakeChan adapts a channel to WorkSignal: each receive wakes the processor.
type WakeChan <-chan struct{}

// Wake returns c.
func (c WakeChan) Wake() <-chan struct{} { return c }

// ListenerOptions configures a Listener. The zero value of each field
// takes its documented default.
type ListenerOptions struct {
	// MinBackoff is the wait before the first reconnect after the
	// connection broke or could not be made, > 0; it doubles after each
	// failed try. Defaults to 100 milliseconds.
	MinBackoff time.Duration
	// MaxBackoff caps the reconnect wait, >= MinBackoff. Defaults to 30
	// seconds.
	MaxBackoff time.Duration
	// ProbeWait is how long the listener waits, after each LISTEN, for
	// the notification it sends itself from a second connection, > 0.
	// When it does not arrive the connection cannot deliver notifications
	// and Run returns a *ListenerUndeliveredError. Defaults to 5 seconds.
	ProbeWait time.Duration
	// OnError, when not nil, receives connection errors before each
	// reconnect wait, and the *ListenerUndeliveredError before Run returns
	// it. It is called from Run's goroutine.
	OnError func(error)
	// Logger, when not nil, receives the listener's events, each with the
	// attributes queue and channel: "listener connected" (info, after
	// every LISTEN that delivers, so also after a reconnect), "listener
	// connection lost; reconnecting" (warn, with error and backoff) and
	// "listener stopped: notifications do not arrive" (error). nil, the
	// default, logs nothing: a library should not write to a program's
	// log unasked, and OnError already reports the errors.
	Logger *slog.Logger
}

// ListenerUndeliveredError is what Listener.Run returns when LISTEN
// succeeded but a notification sent to the channel from another
// connection did not arrive within ListenerOptions.ProbeWait: the
// connection does not deliver notifications. A transaction-mode pooler
// (PgBouncer, Supavisor, RDS Proxy, a pooled Neon endpoint) does that: it
// runs LISTEN on a server session and hands the session to other clients.
// Point the Listener's connection config at PostgreSQL itself.
type ListenerUndeliveredError struct {
	// Channel is the channel LISTENed on.
	Channel string
	// Waited is how long the listener waited for its notification.
	Waited time.Duration
}

// Error says what did not arrive and what to do.
func (e *ListenerUndeliveredError) Error() string {
	return fmt.Sprintf("processor: LISTEN on %s succeeded but a notification sent to it did not arrive within %s; "+
		"the connection cannot deliver notifications (a transaction-mode pooler?): connect the Listener to PostgreSQL directly",
		e.Channel, e.Waited)
}

// Listener is a WorkSignal fed by PostgreSQL: it LISTENs on a queue's
// channel over a dedicated connection (not from a pool) and wakes its
// processor on every notification. The insert trigger (migration 00009)
// notifies on average at most once per 10 ms per table (bursts of five),
// so that producers do not queue on PostgreSQL's notify lock at commit; a
// row that commits without a notification of its own, just after one, is
// found by the processor's short polls after a claim that found work (see
// Options.PollInterval). LISTEN holds a server session, so the
// connection must reach PostgreSQL directly, not through a
// transaction-mode pooler: after each LISTEN the listener sends the
// channel a notification from a second, short-lived connection and
// refuses to run (ListenerUndeliveredError) when it does not come back.
// Every listener of the channel receives that notification and wakes
// once. Wakes coalesce: the channel holds at most one, however many
// notifications arrive. When the connection breaks
// (network, server restart, pg_terminate_backend) Run reconnects with
// capped exponential backoff and then wakes once, since rows may have
// arrived while it was away. Give each Processor its own Listener: one
// wake reaches one receiver.
type Listener struct {
	config  *pgx.ConnConfig
	channel string
	opts    ListenerOptions
	wake    chan struct{}
	pid     atomic.Uint32
	running atomic.Bool
}

var _ WorkSignal = (*Listener)(nil)

// NewListener returns a listener for queue q that connects with a copy of
// config and LISTENs on q.Channel(). Call Run to start it. config must
// reach PostgreSQL directly: pool.Config().ConnConfig when the pool does,
// else a config of its own (pgx.ParseConfig of the server's URL) while
// the pool goes through the pooler.
//
// Errors: a *leasing.ArgumentError for a nil config, an unknown queue or
// bad options.
func NewListener(config *pgx.ConnConfig, q leasing.Queue, opts ListenerOptions) (*Listener, error) {
	if config == nil {
		return nil, argumentError("connection config", "must not be nil")
	}
	if _, err := leasing.ParseQueue(string(q)); err != nil {
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
	if err := leasing.ValidatePositive("listener probe wait", opts.ProbeWait); err != nil {
		return nil, err
	}
	return &Listener{config: config.Copy(), channel: q.Channel(), opts: opts, wake: make(chan struct{}, 1)}, nil
}

// Wake returns the channel that receives one value after notifications
// arrived (and after each successful LISTEN). It has a buffer of one.
func (l *Listener) Wake() <-chan struct{} { return l.wake }

// Channel returns the channel name listened on.
func (l *Listener) Channel() string { return l.channel }

// BackendPID returns the server process id of the current listening
// connection, or 0 while no LISTEN is in place: before the first connect
// and between a broken connection and the next successful LISTEN.
func (l *Listener) BackendPID() uint32 { return l.pid.Load() }

// Run connects, LISTENs, checks that notifications arrive and wakes on
// them until ctx is cancelled, reconnecting after every connection error;
// it then closes the connection and returns nil.
//
// Errors: an error at once when Run is already running on l; a
// *ListenerUndeliveredError, after passing it to OnError, when a
// connection accepted LISTEN but did not deliver the listener's own
// notification.
func (l *Listener) Run(ctx context.Context) error {
	if !l.running.CompareAndSwap(false, true) {
		return errors.New("processor: listener already running")
	}
	defer l.running.Store(false)
	backoff := l.opts.MinBackoff
	for {
		err := l.listen(ctx, func() { backoff = l.opts.MinBackoff; l.logConnected() })
		if ctx.Err() != nil {
			return nil
		}
		var undelivered *ListenerUndeliveredError
		if errors.As(err, &undelivered) {
			l.logUndelivered(err)
			if l.opts.OnError != nil {
				l.opts.OnError(err)
			}
			return err
		}
		if l.opts.OnError != nil {
			l.opts.OnError(fmt.Errorf("processor: listen on %s: %w", l.channel, err))
		}
		l.logReconnect(err, backoff)
		if !pause(ctx, backoff) {
			return nil
		}
		backoff = min(backoff*2, l.opts.MaxBackoff)
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
	// LISTEN takes no parameters; the channel is one of our two fixed
	// names, quoted as an identifier.
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{l.channel}.Sanitize()); err != nil {
		return err
	}
	if err := l.probe(ctx, conn); err != nil {
		return err
	}
	l.pid.Store(conn.PgConn().PID())
	connected()
	l.signal()
	for {
		if _, err := conn.WaitForNotification(ctx); err != nil {
			return err
		}
		l.signal()
	}
}

// signal leaves one wake in the channel unless one is already there.
func (l *Listener) signal() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// probe sends the channel a notification with a payload of its own from a
// second connection and waits for it on conn, which LISTENs. The second
// connection matters: a session receives its own notifications, and
// behind a transaction pooler the probe could run on the very server
// session that ran LISTEN and come back with the reply. Other
// notifications that arrive meanwhile wake the processor as usual.
//
// Errors: a *ListenerUndeliveredError when the probe does not arrive
// within ProbeWait; else a connection error.
func (l *Listener) probe(ctx context.Context, conn *pgx.Conn) error {
	payload := listenerProbePrefix + rand.Text()
	sender, err := pgx.ConnectConfig(ctx, l.config.Copy())
	if err != nil {
		return err
	}
	err = gen.New().SignalProbe(ctx, sender, gen.SignalProbeParams{Channel: l.channel, Payload: payload})
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
			return &ListenerUndeliveredError{Channel: l.channel, Waited: l.opts.ProbeWait}
		case err != nil:
			return err
		case n.Payload == payload:
			return nil
		}
		l.signal()
	}
}
