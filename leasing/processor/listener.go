package processor

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/leasestore/leasestore/leasing"
)

// Listener defaults, used for zero ListenerOptions fields.
const (
	DefaultListenerMinBackoff = 100 * time.Millisecond
	DefaultListenerMaxBackoff = 30 * time.Second
)

// listenerCloseTimeout bounds closing a listener connection.
const listenerCloseTimeout = 5 * time.Second

// WorkSignal wakes a Processor before its poll interval ends, e.g. a
// Listener on the queue's NOTIFY channel. Wake returns the same channel on
// every call; a receive on it makes the processor claim at once.
type WorkSignal interface {
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
	// OnError, when not nil, receives connection errors before each
	// reconnect wait. It is called from Run's goroutine.
	OnError func(error)
}

// Listener is a WorkSignal fed by PostgreSQL: it LISTENs on a queue's
// channel over a dedicated connection (not from a pool) and wakes its
// processor on every notification. Wakes coalesce: the channel holds at
// most one, however many notifications arrive. When the connection breaks
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
// config (e.g. pool.Config().ConnConfig) and LISTENs on q.Channel(). Call
// Run to start it.
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

// Run connects, LISTENs and wakes on notifications until ctx is cancelled,
// reconnecting after every connection error; it then closes the
// connection and returns nil.
//
// Errors: an error at once when Run is already running on l.
func (l *Listener) Run(ctx context.Context) error {
	if !l.running.CompareAndSwap(false, true) {
		return errors.New("processor: listener already running")
	}
	defer l.running.Store(false)
	backoff := l.opts.MinBackoff
	for {
		err := l.listen(ctx, func() { backoff = l.opts.MinBackoff })
		if ctx.Err() != nil {
			return nil
		}
		if l.opts.OnError != nil {
			l.opts.OnError(fmt.Errorf("processor: listen on %s: %w", l.channel, err))
		}
		if !pause(ctx, backoff) {
			return nil
		}
		backoff = min(backoff*2, l.opts.MaxBackoff)
	}
}

// listen holds one connection until it fails or ctx ends; it calls
// connected once LISTEN is in place.
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
