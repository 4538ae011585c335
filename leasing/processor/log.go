package processor

import (
	"context"
	"log/slog"

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
