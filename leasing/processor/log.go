package processor

import (
	"context"
	"errors"
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
	LogKeyVerdict    = "verdict"    // the handler's Verdict on its error: retry, permanent, retry_after, unavailable
	LogKeyTopic      = "topic"      // a breaker's topic (outbox) or message type (inbox)
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

// batchAttrs are the attributes of the leases of one batch call, then
// extra.
func batchAttrs(leases []leasing.Lease, extra ...slog.Attr) []slog.Attr {
	ids := make([]string, len(leases))
	for i, l := range leases {
		ids[i] = l.Message.ID.String()
	}
	return append([]slog.Attr{slog.Int("count", len(leases)), slog.Any("message_ids", ids)}, extra...)
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

// loggedVacuumer is a Vacuumer that logs each run (debug, one record per
// table vacuumed) and each error (warn) of the Vacuumer it wraps.
type loggedVacuumer struct {
	Vacuumer
	queue leasing.Queue
	log   logger
}

// vacuumer returns v, wrapped to log when p logs.
func (p *Processor) vacuumer(v Vacuumer) Vacuumer {
	if p.ev.log.l == nil {
		return v
	}
	return loggedVacuumer{Vacuumer: v, queue: p.store.Queue(), log: p.ev.log}
}

// vacuumNotAllowedAdvice is the processor's one log record when its role
// may not vacuum, with what to do; internal/doctor gives the same advice.
const vacuumNotAllowedAdvice = "this role may not VACUUM the queue's tables, which are left to autovacuum: " +
	"fine at moderate churn; to have processors vacuum, rerun db/roles.sql on PostgreSQL 17+ (it grants MAINTAIN) " +
	"or run them as the tables' owner; VacuumPolicy.Disabled silences this"

func (v loggedVacuumer) VacuumIfDead(ctx context.Context, deadRows int64) (leasing.Vacuum, error) {
	res, err := v.Vacuumer.VacuumIfDead(ctx, deadRows)
	switch {
	case errors.Is(err, leasing.ErrVacuumNotAllowed):
		v.log.log(slog.LevelInfo, vacuumNotAllowedAdvice, errAttr(err))
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
