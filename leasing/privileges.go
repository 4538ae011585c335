package leasing

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/leasestore/leasestore/gen"
)

// ErrPermissionDenied is matched (errors.Is) by the error of a Postgres
// call that the database refused for lack of a privilege or for a
// row-level security policy (SQLSTATE 42501, insufficient_privilege; the
// error also wraps the server's *pgconn.PgError), and by every
// *PrivilegeError. The refused transaction changed nothing; trying it
// again changes nothing either until someone grants what is missing
// (db/roles.sql grants a processor's privileges to leasestore_processor).
// (A claim whose freeing of parked rows' keys is refused committed the
// claim: see ParkedError.KeysNotFreed.) Memory never returns it.
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
// every statement a processor sends: claim (untenanted and of one
// tenant), renew, release, release orphans, complete (publish), fail,
// dead letter, and the freeing of ordering keys that completes and dead
// letters of keyed messages do. It runs each call's statements for no
// message (claims of zero rows, writes of no leases, an orphan sweep for
// an owner that holds nothing) in a transaction of its own that it rolls
// back, with the settings every call runs with (READ COMMITTED, generic
// plans, PostgresOptions.LockTimeout), so the server checks the table and
// column privileges those statements use, and nothing changes. Row-level
// security policies are not checked: no row is read. It first waits for
// the store's schema check, like a claim. It does not check what
// enqueues, requeues, purges and VACUUM need (see VacuumIfDead).
// processor.Processor calls it before its first claim and refuses to run
// on a *PrivilegeError: without those privileges its claims could succeed
// and its outcome writes fail, so that every handler would run again after
// each lease expiry.
//
// Errors: a *PrivilegeError naming each refused call; a *SchemaError when
// the schema check fails; ErrLockTimeout when a statement waited longer
// than PostgresOptions.LockTimeout for a table lock (DDL); otherwise the
// driver error.
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

// checkTimeout bounds the rollback of each transaction of refusedCalls,
// which runs even when ctx has ended.
const checkTimeout = 5 * time.Second

// refusedCalls runs each of processorCalls in a transaction of its own,
// in one batch after the prelude of pipeline (READ COMMITTED, generic
// plans, the lock timeout), and rolls it back; it returns the calls
// refused for lack of a privilege.
func (s *Postgres) refusedCalls(ctx context.Context) ([]RefusedCall, error) {
	var refused []RefusedCall
	for _, c := range s.processorCalls(ctx) {
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

// rolledBack sends steps as sendOnce does, in a transaction that it then
// rolls back.
func (s *Postgres) rolledBack(ctx context.Context, steps []func(gen.DBTX) error) error {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return mapErr(err)
	}
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), checkTimeout)
		defer cancel()
		_ = tx.Rollback(rctx)
	}()
	return s.sendOnce(ctx, tx, s.genericPlansStep(ctx), steps)
}

// processorCall is one call of a processor, as CheckPrivileges runs it:
// its statements for no message, one step each.
type processorCall struct {
	name  string
	steps []func(db gen.DBTX) error
}

// processorCalls returns the calls a processor makes, each sending its
// statements for no message.
func (s *Postgres) processorCalls(ctx context.Context) []processorCall {
	now := s.pinned()
	// An owner no lease has, so that even release orphans matches no row.
	owner := NewOwner("privilege-check")
	none := fenceArgs{now: now, owner: owner, ids: []uuid.UUID{}, generations: []int64{}}
	noFailures := failArgs{fenceArgs: none, retryDelays: []time.Duration{}, lastErrors: []string{}, attemptErrors: []string{}}
	claim := claimArgs{now: now, owner: owner}
	complete := "complete"
	if s.queue == Outbox {
		complete = "publish"
	}
	one := func(step func(gen.DBTX) error) []func(gen.DBTX) error { return []func(gen.DBTX) error{step} }
	return []processorCall{
		{"claim", []func(gen.DBTX) error{
			func(db gen.DBTX) error { _, _, err := s.sql.claim(ctx, db, claim); return err },
			func(db gen.DBTX) error { _, _, err := s.sql.claimTenant(ctx, db, claim); return err },
		}},
		{"renew", one(func(db gen.DBTX) error { _, err := s.sql.renew(ctx, db, none, 0); return err })},
		{"release", one(func(db gen.DBTX) error { _, err := s.sql.release(ctx, db, none); return err })},
		{"release orphans", one(func(db gen.DBTX) error { _, err := s.sql.releaseOrphans(ctx, db, now, owner, nil); return err })},
		{complete, one(func(db gen.DBTX) error { _, err := s.sql.complete(ctx, db, none); return err })},
		{"fail", one(func(db gen.DBTX) error { _, err := s.sql.fail(ctx, db, noFailures); return err })},
		{"dead letter", one(func(db gen.DBTX) error { _, err := s.sql.deadLetter(ctx, db, noFailures); return err })},
		// The statements a complete or dead letter of keyed leases adds,
		// for an id no message has.
		{"free ordering keys", s.keySteps(ctx, []uuid.UUID{uuid.New()})},
	}
}
