package leasing

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/leasestore/leasestore/gen"
)

// ErrInstanceInUse is matched (errors.Is) by every *InstanceInUseError.
var ErrInstanceInUse = errors.New("leasing: processor instance identity in use")

// InstanceInUseError is LockInstance's refusal: another live session holds
// the identity of a processor instance (queue and owner label).
// errors.Is(err, ErrInstanceInUse) holds.
type InstanceInUseError struct {
	// Queue is the instance's queue.
	Queue Queue
	// Label is the instance's owner label (see NewOwner).
	Label string
	// HolderPID is the server process id of the session that holds the
	// identity, 0 when it ended before it could be read.
	HolderPID int32
}

// Error implements error: the identity, its holder and what to do.
func (e *InstanceInUseError) Error() string {
	return fmt.Sprintf("leasing: processor instance %q of %s is held by another live session (server pid %d): two processes must not share an instance id; give each its own",
		e.Label, e.Queue, e.HolderPID)
}

// Is reports whether target is ErrInstanceInUse.
func (e *InstanceInUseError) Is(target error) bool { return target == ErrInstanceInUse }

// InstanceLock holds the identity of one processor instance: a
// session-level advisory lock, named by the queue and the owner label, on
// a dedicated connection. The server frees it when the session ends, so
// that the successor of a crashed process takes the identity at once while
// a second live process cannot. Its methods are not safe for concurrent
// use.
type InstanceLock struct {
	conn  *pgx.Conn
	queue Queue
	label string
}

// instanceLockName is the advisory lock name of an instance's identity.
func instanceLockName(q Queue, label string) string {
	return "leasestore:instance:" + string(q) + ":" + label
}

// instanceCloseTimeout bounds the close of a lock's connection.
const instanceCloseTimeout = 5 * time.Second

// LockInstance connects with a copy of config and takes the identity of
// the processor instance of queue q whose lease owners NewOwner makes from
// label, without waiting. config must reach PostgreSQL directly, as a
// Listener's (a session lock taken through a transaction-mode pooler would
// stay on a server session others share): LockInstance compares the
// holder's server process id with the one the connection announced and
// refuses a connection where they differ. Two labels collide only if their
// 64-bit hashes (hashtextextended) do, which refuses a distinct identity.
//
// Errors: an *ArgumentError for a nil config, an unknown queue or a bad
// label; an *InstanceInUseError when another session holds the identity;
// an error naming the pooler when the connection is not direct; else the
// connection's error.
func LockInstance(ctx context.Context, config *pgx.ConnConfig, q Queue, label string) (*InstanceLock, error) {
	if config == nil {
		return nil, argumentError("config", "must not be nil")
	}
	if _, err := ParseQueue(string(q)); err != nil {
		return nil, err
	}
	if err := ValidateOwnerLabel(label); err != nil {
		return nil, err
	}
	conn, err := pgx.ConnectConfig(ctx, config.Copy())
	if err != nil {
		return nil, fmt.Errorf("leasing: lock instance %q of %s: connect: %w", label, q, err)
	}
	l := &InstanceLock{conn: conn, queue: q, label: label}
	if err := l.lock(ctx); err != nil {
		_ = l.Close(ctx)
		return nil, err
	}
	return l, nil
}

// lock takes the advisory lock on l's connection, checks that the session
// holding it is that connection's, and reports a holder that is not.
func (l *InstanceLock) lock(ctx context.Context) error {
	g := gen.New()
	name := instanceLockName(l.queue, l.label)
	locked, err := g.InstanceLock(ctx, l.conn, gen.InstanceLockParams{LockName: name})
	if err != nil {
		return fmt.Errorf("leasing: lock instance %q of %s: %w", l.label, l.queue, mapErr(err))
	}
	holders, err := g.InstanceLockHolder(ctx, l.conn, gen.InstanceLockHolderParams{LockName: name})
	if err != nil {
		return fmt.Errorf("leasing: lock instance %q of %s: read the holder: %w", l.label, l.queue, mapErr(err))
	}
	var holder int32
	if len(holders) > 0 {
		holder = holders[0].Int32
	}
	if !locked {
		return &InstanceInUseError{Queue: l.queue, Label: l.label, HolderPID: holder}
	}
	if own := int32(l.conn.PgConn().PID()); holder != own {
		return fmt.Errorf("leasing: lock instance %q of %s: the lock is held by server pid %d, not by this connection's %d: connect directly to PostgreSQL, not through a pooler",
			l.label, l.queue, holder, own)
	}
	return nil
}

// Queue returns the instance's queue.
func (l *InstanceLock) Queue() Queue { return l.queue }

// Label returns the instance's owner label.
func (l *InstanceLock) Label() string { return l.label }

// Ping reports whether the lock's session is alive, and so whether the
// lock is still held: a session that ended freed it.
//
// Errors: the connection's error; the lock is then lost and a new
// LockInstance may take it again or be refused.
func (l *InstanceLock) Ping(ctx context.Context) error {
	if err := l.conn.Ping(ctx); err != nil {
		return fmt.Errorf("leasing: instance %q of %s: lock session lost: %w", l.label, l.queue, err)
	}
	return nil
}

// Close frees the identity and ends the lock's session: it unlocks first,
// so that the identity is free when Close returns (a session's locks
// outlive the client's close until the server process has ended). It
// waits at most 5 seconds, also after ctx has ended.
//
// Errors: the connection's error on close. A failed unlock is not one:
// the session's end frees the lock.
func (l *InstanceLock) Close(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), instanceCloseTimeout)
	defer cancel()
	_ = gen.New().InstanceUnlock(cctx, l.conn, gen.InstanceUnlockParams{LockName: instanceLockName(l.queue, l.label)})
	return l.conn.Close(cctx)
}

// ExpirePrevious ends now the unexpired leases that NewOwner(label) owners
// other than owner hold on the store's queue: those of the earlier
// incarnations of a processor instance whose identity the caller holds
// (LockInstance), so that a restart takes over a crashed process's leases
// at once instead of after their expiry. The rows stay leased, lease owner
// and generation kept, with an expiry of the store's now: the next claim
// reclaims them as expired leases, counting their attempt (the handler may
// have run before the crash) and appending the expired entry to their
// attempt history. Rows locked by others are skipped and expire in time.
// Returns the expired message ids in id order.
//
// Errors: an *ArgumentError for a bad label or owner; else as Store's.
func (s *Postgres) ExpirePrevious(ctx context.Context, label, owner string) ([]uuid.UUID, error) {
	if err := ValidateOwnerLabel(label); err != nil {
		return nil, err
	}
	if err := validateOwner(owner); err != nil {
		return nil, err
	}
	expire := bind(s.q.expirePrevious, gen.InboxExpirePreviousParams{Now: s.pinned(), OwnerLabel: label, LeaseOwner: owner})
	if err := s.send(ctx, operator, expire); err != nil {
		return nil, fmt.Errorf("leasing: expire previous leases of %q on %s: %w", label, s.queue, err)
	}
	return expire.out, nil
}
