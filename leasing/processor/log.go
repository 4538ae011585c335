package processor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/leasestore/leasestore/leasing"
)

// Attribute keys of the log records a Processor writes, and of those of a
// leasing.Listener. Every record of a processor carries LogKeyQueue and
// LogKeyOwner; every record of a listener, LogKeyQueue and LogKeyChannel.
const (
	LogKeyQueue      = "queue"      // the queue: inbox or outbox
	LogKeyOwner      = "owner"      // the processor's lease owner name (Processor.Owner)
	LogKeyMessageID  = "message_id" // the message id
	LogKeyAttempt    = "attempt"    // the lease's attempt, 1 on the first delivery
	LogKeyGeneration = "generation" // the lease's generation (fencing token)
	LogKeyError      = "error"      // the error, or the error text written with an outcome
	LogKeyChannel    = "channel"    // a leasing.Listener's NOTIFY channel
)

// logger writes the structured events of a processor to l;
// with a nil l it writes nothing, and builds no attributes.
type logger struct{ l *slog.Logger }

func (g logger) enabled(level slog.Level) bool {
	return g.l != nil && g.l.Enabled(context.Background(), level)
}

func (g logger) log(level slog.Level, msg string, attrs ...slog.Attr) {
	if g.enabled(level) {
		g.l.LogAttrs(context.Background(), level, msg, attrs...)
	}
}

// leaseAttrs are the attributes of one lease, then extra.
func leaseAttrs(l leasing.Lease, extra ...slog.Attr) []slog.Attr {
	return append([]slog.Attr{
		slog.String(LogKeyMessageID, l.Message.ID.String()),
		slog.Int(LogKeyAttempt, l.Attempt),
		slog.Int64(LogKeyGeneration, l.Generation),
	}, extra...)
}

func errAttr(err error) slog.Attr { return slog.String(LogKeyError, err.Error()) }

// newLogger returns the logger of a processor of queue q and owner, or the
// zero logger for a nil l.
func newLogger(l *slog.Logger, q leasing.Queue, owner string) logger {
	if l == nil {
		return logger{}
	}
	return logger{l.With(slog.String(LogKeyQueue, string(q)), slog.String(LogKeyOwner, owner))}
}

// claimFailed reports and logs a failed claim (warn: the processor claims
// again later, sweeping orphans first).
func (p *Processor) claimFailed(err error) {
	p.report(p.errorf("claim", err))
	p.log.log(slog.LevelWarn, "claim failed", errAttr(err))
}

// claimParked reports the *leasing.ParkedError pe of a claim and logs each
// row it parked (warn: the row is dead-lettered), and, as an error, keys
// the store could not free (their messages wait for an operator).
func (p *Processor) claimParked(pe *leasing.ParkedError) {
	p.report(p.errorf("claim", pe))
	for _, r := range pe.Parked {
		p.log.log(slog.LevelWarn, "message parked by the claim",
			slog.String(LogKeyMessageID, r.ID.String()), slog.String(LogKeyError, r.Reason))
	}
	if pe.KeysNotFreed != nil {
		p.log.log(slog.LevelError, "ordering keys of parked messages not freed: requeue or purge them",
			slog.Int("parked", len(pe.Parked)), errAttr(pe.KeysNotFreed))
	}
}

// sweepFailed reports and logs a failed orphan sweep (warn: tried again
// before the next claim).
func (p *Processor) sweepFailed(err error) {
	p.report(p.errorf("release orphans", err))
	p.log.log(slog.LevelWarn, "orphan sweep failed", errAttr(err))
}

// renewFailed reports and logs a failed Renew of n leases (warn: the next
// heartbeat tries again; leases not renewed in time are lost).
func (p *Processor) renewFailed(n int, err error) {
	p.report(p.errorf("renew", err))
	p.log.log(slog.LevelWarn, "renew failed", slog.Int("leases", n), errAttr(err))
}

// writeTryFailed reports and logs a failed outcome-write try (warn: tried
// again after a backoff).
func (p *Processor) writeTryFailed(try int, err error) {
	p.report(p.errorf(fmt.Sprintf("outcome write, try %d", try), err))
	p.log.log(slog.LevelWarn, "outcome write failed; retrying", slog.Int("try", try), errAttr(err))
}

// writeGaveUp reports and logs an outcome write of g given up (error: the
// outcomes are lost; the leases expire and the messages are claimed again).
func (p *Processor) writeGaveUp(kind writeKind, g []pendingWrite, err error) {
	p.report(p.errorf(fmt.Sprintf("gave up writing %d outcomes", len(g)), err))
	if !p.log.enabled(slog.LevelError) {
		return
	}
	ids := make([]string, len(g))
	for i, pw := range g {
		ids[i] = pw.failure.Lease.Message.ID.String()
	}
	p.log.log(slog.LevelError, "gave up writing outcomes", slog.String("operation", writeOperations[kind]),
		slog.Int("count", len(g)), slog.Any("message_ids", ids), errAttr(err))
}

// privilegesMissing reports and logs err, the *leasing.PrivilegeError of
// the check before the first claim (error: the processor does not run),
// and returns the error Run returns.
func (p *Processor) privilegesMissing(err error) error {
	err = p.errorf("refuses to run", err)
	p.report(err)
	p.log.log(slog.LevelError, "not running: the store's role lacks privileges", errAttr(err))
	return err
}

// privilegeCheckFailed reports and logs a privilege check that could not
// tell (warn: tried again at the next poll, before any claim).
func (p *Processor) privilegeCheckFailed(err error) {
	p.report(p.errorf("check privileges", err))
	p.log.log(slog.LevelWarn, "privilege check failed; trying again before claiming", errAttr(err))
}

// writeRefused logs an outcome write the database refused for lack of a
// privilege (error: the processor stops); writeGaveUp reported it.
func (p *Processor) writeRefused(err error) {
	p.log.log(slog.LevelError, "stopping: the database refused an outcome write for lack of a privilege", errAttr(err))
}

// logWritten logs the outcomes of g that res reports: each dead letter
// written (warn), each failure written (debug: the retry is scheduled) and
// each outcome the fence refused (warn). A success logs nothing.
func (p *Processor) logWritten(kind writeKind, g []pendingWrite, res leasing.WriteResult) {
	for i, o := range res.Outcomes {
		if i >= len(g) {
			break
		}
		f := g[i].failure
		switch {
		case !o.Outcome.Succeeded():
			p.log.log(slog.LevelWarn, "outcome not written: the lease fence refused it", leaseAttrs(f.Lease,
				slog.String("operation", writeOperations[kind]), slog.String("outcome", string(o.Outcome)))...)
		case o.Outcome != leasing.OutcomeApplied:
			// already applied by this lease: logged when it was
		case kind == writeDeadLetter:
			p.log.log(slog.LevelWarn, "message dead-lettered", leaseAttrs(f.Lease, slog.String(LogKeyError, f.Error))...)
		case kind == writeFail && p.log.enabled(slog.LevelDebug):
			p.log.log(slog.LevelDebug, "attempt failed; retry scheduled", leaseAttrs(f.Lease,
				slog.Duration("retry_after", f.RetryAfter), slog.String(LogKeyError, f.Error))...)
		}
	}
}

// callAttrs are the attributes of the leases of one handler call, then
// extra: those of the lease (leaseAttrs) for New, the count and message
// ids (batchAttrs) for NewBatch, whatever the call's size.
func (p *Processor) callAttrs(leases []leasing.Lease, extra ...slog.Attr) []slog.Attr {
	if p.batch == nil {
		return leaseAttrs(leases[0], extra...)
	}
	return batchAttrs(leases, extra...)
}

// batchAttrs are the attributes of the leases of one batch call, then
// extra.
func batchAttrs(leases []leasing.Lease, extra ...slog.Attr) []slog.Attr {
	ids := make([]string, len(leases))
	for i, l := range leases {
		ids[i] = l.Message.ID.String()
	}
	return append([]slog.Attr{slog.Int("count", len(leases)), slog.Any("message_ids", ids)}, extra...)
}

// handlerPanicked logs the panic of a handler call over leases with value
// v and stack (error, once for the call).
func (p *Processor) handlerPanicked(leases []leasing.Lease, v any, stack []byte) {
	if p.log.enabled(slog.LevelError) {
		p.log.log(slog.LevelError, "handler panicked", p.callAttrs(leases,
			slog.String(LogKeyError, fmt.Sprint(v)), slog.String("stack", string(stack)))...)
	}
}

// handlerTimedOut logs a handler call that ran past HandlerTimeout with
// leases still running (warn, once for the call: their attempts are
// written as failed or dead-lettered).
func (p *Processor) handlerTimedOut(leases []leasing.Lease) {
	if p.log.enabled(slog.LevelWarn) {
		p.log.log(slog.LevelWarn, "handler timed out", p.callAttrs(leases, slog.Duration("timeout", p.opts.HandlerTimeout))...)
	}
}

// leaseLost logs h given up as lost (warn: its handler is cancelled and
// its outcome is not written; the message is delivered again).
func (g logger) leaseLost(h *heldLease) {
	g.log(slog.LevelWarn, "lease lost", leaseAttrs(h.lease)...)
}

// loggedVacuumer is a Vacuumer that logs each run (debug, one record per
// table vacuumed) and each error (warn) of the Vacuumer it wraps.
type loggedVacuumer struct {
	Vacuumer
	queue leasing.Queue
	log   logger
}

// vacuumer returns v, wrapped to log when p logs.
func (p *Processor) vacuumer(v Vacuumer) Vacuumer {
	if p.log.l == nil {
		return v
	}
	return loggedVacuumer{Vacuumer: v, queue: p.store.Queue(), log: p.log}
}

func (v loggedVacuumer) VacuumIfDead(ctx context.Context, deadRows int64) (leasing.Vacuum, error) {
	res, err := v.Vacuumer.VacuumIfDead(ctx, deadRows)
	switch {
	case errors.Is(err, leasing.ErrVacuumNotAllowed):
		v.log.log(slog.LevelWarn, "vacuum not allowed; the table is left to autovacuum", errAttr(err))
	case err != nil && ctx.Err() == nil:
		v.log.log(slog.LevelWarn, "vacuum failed", errAttr(err))
	}
	if res.Ran {
		v.vacuumRan(v.queue.Table(), res.DeadRows, res.Duration)
	}
	if res.Keys.Ran {
		v.vacuumRan(v.queue.KeyTable(), res.Keys.DeadRows, res.Keys.Duration)
	}
	return res, err
}

// vacuumRan logs one VACUUM of table (debug).
func (v loggedVacuumer) vacuumRan(table string, deadRows int64, d time.Duration) {
	v.log.log(slog.LevelDebug, "vacuum ran", slog.String("table", table), slog.Int64("dead_rows", deadRows), slog.Duration("duration", d))
}
