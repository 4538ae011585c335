package processor

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/leasestore/leasestore/leasing"
)

// TxHandler works one leased message inside tx, a transaction on the
// store's database that the processor began for the call: the transactional
// inbox. Its writes in tx and the message's completion commit together, or
// neither does, so each message's effect is applied exactly once, and the
// service needs no table of applied messages of its own. PostgreSQL only
// (NewTx).
//
// A nil return completes the message in tx (leasing.Postgres.CompleteTx)
// and commits tx. When the lease was lost meanwhile (expired and claimed
// again, requeued, finished by another lease) the completion's fence
// refuses it: tx is rolled back and the attempt ends with an error
// matching leasing.ErrLeaseLost or leasing.ErrAlreadyTerminal, whose
// write the fence refuses in turn. An error, a panic, a timeout or a lost
// lease rolls tx back, and the message is failed, retried or
// dead-lettered per the RetryPolicy as for a Handler, in a transaction of
// its own; a verdict (Permanent, RetryAfter, Unavailable) wrapped around
// the error counts as for a Handler.
//
// ctx is cancelled as for a Handler, and tx dies with it: a handler whose
// lease is lost or whose HandlerTimeout ran out cannot commit. Use tx for
// every write of the effect; its Commit and Rollback return
// ErrTxHandlerEndedTx and do nothing (tx.Begin's savepoints work). Work
// that leaves the database (an HTTP call, a broker) is not undone by the
// rollback: it stays at least once.
type TxHandler func(ctx context.Context, tx pgx.Tx, lease leasing.Lease) error

// NewTx returns a processor that runs handler on each message of store's
// queue inside a transaction on store's pool (see TxHandler), with the
// Options of New. A TxHandler needs PostgreSQL: store is a
// *leasing.Postgres, and the Memory store has no transactional form.
//
// Each running handler holds one of the pool's connections for its whole
// call; the claims, the heartbeat that renews the handlers' leases and the
// outcome writes need at least one more. The pool's MaxConns must
// therefore exceed Options.Concurrency, which defaults here to the
// smaller of DefaultConcurrency and MaxConns - 1. A handler that uses the
// pool beside tx needs more still.
//
// After a commit the processor writes nothing more for the message: its
// completion committed with the handler's writes.
//
// Errors: a *leasing.ArgumentError for a nil store or handler, for a pool
// whose MaxConns does not exceed Concurrency, and as for New.
func NewTx(store *leasing.Postgres, handler TxHandler, opts Options) (*Processor, error) {
	if store == nil {
		return nil, argumentError("store", "must not be nil: a TxHandler runs in a PostgreSQL transaction and needs a *leasing.Postgres")
	}
	if handler == nil {
		return nil, argumentError("handler", "must not be nil")
	}
	conns := store.Pool().Config().MaxConns
	if opts.Concurrency == 0 {
		opts.Concurrency = max(1, min(DefaultConcurrency, int(conns)-1))
	}
	p, err := New(store, txHandler{store: store, handler: handler}.handle, opts)
	if err != nil {
		return nil, err
	}
	p.completesTx = true
	if int(conns) <= p.opts.Concurrency {
		return nil, argumentError("concurrency", "each running TxHandler holds one of the pool's %d connections (MaxConns) "+
			"and the heartbeat needs another: Concurrency %d needs MaxConns of at least %d", conns, p.opts.Concurrency, p.opts.Concurrency+1)
	}
	return p, nil
}

// ErrTxHandlerEndedTx is what Commit and Rollback return to a TxHandler
// on the transaction it was given: the processor ends it, committing it
// with the message's completion, so that the effect never commits alone.
var ErrTxHandlerEndedTx = errors.New("processor: a TxHandler must not commit or roll back its transaction; return nil or an error")

// handlerTx is the transaction a TxHandler gets: tx, whose Commit and
// Rollback it may not call (savepoints through Begin are allowed).
type handlerTx struct{ pgx.Tx }

// Commit refuses: the processor commits.
func (handlerTx) Commit(context.Context) error { return ErrTxHandlerEndedTx }

// Rollback refuses: the processor rolls back after an error.
func (handlerTx) Rollback(context.Context) error { return ErrTxHandlerEndedTx }

// txRollbackTimeout bounds the rollback of a handler's transaction, which
// runs after the handler's context may have ended.
const txRollbackTimeout = 5 * time.Second

// txHandler runs a TxHandler as a Handler.
type txHandler struct {
	store   *leasing.Postgres
	handler TxHandler
}

// handle begins a transaction, runs the handler in it, completes lease in
// it and commits; anything else rolls it back, also a panic, which goes on
// to the processor's recover.
func (t txHandler) handle(ctx context.Context, lease leasing.Lease) (err error) {
	tx, err := t.store.Pool().Begin(ctx)
	if err != nil {
		return fmt.Errorf("processor: begin the handler's transaction: %w", err)
	}
	committed := false
	defer func() {
		if !committed {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), txRollbackTimeout)
			defer cancel()
			_ = tx.Rollback(rctx) // a failed rollback ends the session, which rolls back
		}
	}()
	if err := t.handler(ctx, handlerTx{tx}, lease); err != nil {
		return err
	}
	res, err := t.store.CompleteTx(ctx, tx, lease)
	if err != nil {
		return err
	}
	err = res.Err()
	if gate, ok := ctx.Value(commitGateKey{}).(func() error); ok && err == nil {
		err = gate()
	}
	if err != nil {
		return fmt.Errorf("processor: effects rolled back: %w", err)
	}
	committed = true // from here a failed Commit has rolled back, or committed unknown to us
	if err := tx.Commit(ctx); err != nil {
		// The commit may have happened: the failure's write that follows
		// is fenced, and finds the message completed if it did.
		return fmt.Errorf("processor: commit the handler's transaction: %w", err)
	}
	return nil
}

// commitGateKey is the context key of a NewTx call's commit gate: a
// function that handle calls once the completion is in the transaction,
// just before the commit. It returns the error that must roll the
// transaction back instead (the lease was lost or timed out meanwhile);
// on nil, the processor counts the lease's outcome as being written from
// then on (book.committing).
type commitGateKey struct{}

// withCommitGate returns ctx carrying gate for txHandler.handle.
func withCommitGate(ctx context.Context, gate func() error) context.Context {
	return context.WithValue(ctx, commitGateKey{}, gate)
}
