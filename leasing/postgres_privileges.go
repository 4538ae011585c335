package leasing

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/leasestore/leasestore/gen"
)

// ErrPermissionDenied is matched (errors.Is) by the error of a Postgres
// call that the database refused for lack of a privilege or for a
// row-level security policy (SQLSTATE 42501; the server's
// *pgconn.PgError stays in the chain), and by every *PrivilegeError. The
// refused transaction changed nothing (but see ParkedError.KeysNotFreed);
// db/roles.sql grants what a processor needs. Memory never returns it.
var ErrPermissionDenied = errors.New("leasing: permission denied")

// RefusedCall is one store call whose statements the database refused to
// the store's role (see CheckPrivileges).
type RefusedCall struct {
	// Call names the call: "claim", "renew", "release", "release orphans",
	// "complete" (the inbox) or "publish" (the outbox), "fail",
	// "dead letter", or "free ordering keys" (what completing or
	// dead-lettering a keyed message does in the same transaction).
	Call string
	// Err is the server's refusal; errors.Is(Err, ErrPermissionDenied)
	// holds and errors.As reaches its *pgconn.PgError.
	Err error
}

// String returns the call and the server's message, as in "complete
// (permission denied for table inbox_ordering_keys)".
func (r RefusedCall) String() string {
	msg := r.Err.Error()
	if pgErr := (*pgconn.PgError)(nil); errors.As(r.Err, &pgErr) {
		msg = pgErr.Message
	}
	return r.Call + " (" + msg + ")"
}

// PrivilegeError is CheckPrivileges' report of the processor's calls that
// the database refuses to the store's role. errors.Is(err,
// ErrPermissionDenied) holds.
type PrivilegeError struct {
	// Queue is the store's queue.
	Queue Queue
	// User is the user the store's pool logs in as.
	User string
	// Refused lists the refused calls in the order CheckPrivileges tried
	// them (RefusedCall.Call's order); never empty.
	Refused []RefusedCall
}

// Error implements error: the queue, the user and each refused call with
// the server's message.
func (e *PrivilegeError) Error() string {
	return fmt.Sprintf("leasing: a processor of %s logged in as %q may not %s: run db/roles.sql and log in as a member of leasestore_processor that inherits its rights, or grant what db/roles.sql grants leasestore_processor (the server names one missing table per call)",
		e.Queue, e.User, e.refused())
}

// refused returns the refused calls, each as RefusedCall.String, joined
// by commas.
func (e *PrivilegeError) refused() string {
	calls := make([]string, len(e.Refused))
	for i, r := range e.Refused {
		calls[i] = r.String()
	}
	return strings.Join(calls, ", ")
}

// Is reports whether target is ErrPermissionDenied.
func (e *PrivilegeError) Is(target error) bool { return target == ErrPermissionDenied }

// CheckPrivileges checks that the database lets the store's role run
// every statement a processor sends (RefusedCall.Call lists them): it
// sends each call's statements for no message, as the hot path sends
// them, in a transaction it rolls back, so the server checks the table and
// column privileges and nothing changes. Row-level security is not
// checked (no row is read), nor what enqueues, requeues, purges and
// VACUUM need. processor.Processor calls it before its first claim: with
// claims allowed and outcome writes refused, every handler would run
// again after each lease expiry.
//
// Errors: a *PrivilegeError naming each refused call; else as Store's.
func (s *Postgres) CheckPrivileges(ctx context.Context) error {
	if err := s.schemaReady(ctx); err != nil {
		return err
	}
	refused, err := s.refusedCalls(ctx)
	if err != nil {
		return fmt.Errorf("leasing: check the privileges on %s: %w", s.queue, err)
	}
	if len(refused) == 0 {
		return nil
	}
	return &PrivilegeError{Queue: s.queue, User: s.pool.Config().ConnConfig.User, Refused: refused}
}

// checkTimeout bounds each rollback of refusedCalls, which runs even when
// ctx has ended.
const checkTimeout = 5 * time.Second

// refusedCalls runs each of processorCalls in a transaction of its own,
// sent as the hot path sends, and rolls it back; it returns the calls
// refused for lack of a privilege.
func (s *Postgres) refusedCalls(ctx context.Context) ([]RefusedCall, error) {
	var refused []RefusedCall
	for _, c := range s.processorCalls() {
		err := s.rolledBack(ctx, c.steps)
		switch {
		case errors.Is(err, ErrPermissionDenied):
			refused = append(refused, RefusedCall{Call: c.name, Err: err})
		case err != nil:
			return nil, fmt.Errorf("%s: %w", c.name, err)
		}
	}
	return refused, nil
}

// rolledBack sends steps as the hot path does, in a READ COMMITTED
// transaction that it then rolls back.
func (s *Postgres) rolledBack(ctx context.Context, steps []step) error {
	tx, err := s.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return mapErr(err)
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), checkTimeout)
		defer cancel()
		_ = tx.Rollback(rctx)
	}()
	return s.sendOnce(ctx, tx, hotPath, steps)
}

// processorCall is one call of a processor, as CheckPrivileges runs it:
// its statements for no message.
type processorCall struct {
	name  string
	steps []step
}

// processorCalls returns the calls a processor makes, each sending its
// statements for no message.
func (s *Postgres) processorCalls() []processorCall {
	now := s.pinned()
	// An owner no lease has, so that even release orphans matches no row.
	owner := NewOwner("privilege-check")
	none := idTexts(nil)
	complete := "complete"
	if s.queue == Outbox {
		complete = "publish"
	}
	// The writes' own statements (postgres_write.go), for no lease.
	failed := s.failArgs(owner, nil)
	return []processorCall{
		{"claim", []step{
			bind(s.q.claim, gen.InboxClaimParams{Now: now, LeaseOwner: owner}),
			bind(s.q.claimTenant, gen.InboxClaimTenantParams{Now: now, LeaseOwner: owner}),
		}},
		{"renew", []step{bind(s.q.renew, gen.InboxRenewParams{MessageIds: none, LeaseGenerations: []int64{}, LeaseOwner: owner, Now: now})}},
		{"release", []step{s.release(failed)}},
		{"release orphans", []step{bind(s.q.releaseOrphans, gen.InboxReleaseOrphansParams{LeaseOwner: owner, HeldMessageIds: none, Now: now})}},
		{complete, []step{s.complete(failed.fenceArgs)}},
		{"fail", []step{s.fail(failed)}},
		{"dead letter", []step{s.deadLetter(failed)}},
		// The statements a complete or dead letter of keyed leases adds,
		// for an id no message has.
		{"free ordering keys", s.keySteps([]uuid.UUID{uuid.New()})},
	}
}
