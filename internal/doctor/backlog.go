package doctor

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/leasestore/leasestore/gen"
	"github.com/leasestore/leasestore/internal/plural"
	"github.com/leasestore/leasestore/leasing"
)

// checkBacklog reads q's depth, leases and longest-held key (Stats), the
// overdue check and, unless the schema is behind, the claim's plan and
// cost, into qr, reporting through n. It needs the privileges processors
// have on the queue's tables (checkPrivileges).
func checkBacklog(ctx context.Context, store *leasing.Postgres, q leasing.Queue, opts Options, schemaBehind bool, qr *QueueReport, n notes) error {
	stats, err := store.Stats(ctx)
	if err != nil {
		return fmt.Errorf("doctor: %w", err)
	}
	var rows int64
	for st, count := range stats.Depth {
		qr.Depth[string(st)] = count
		rows += count
	}
	qr.ExpiredLeases, qr.OldestDueSeconds = stats.ExpiredLeases, stats.OldestDueAge.Seconds()
	qr.DeadLettered = stats.Depth[leasing.StatusDeadLettered]
	qr.Waiting = stats.Depth[leasing.StatusWaiting]
	if h := stats.WaitingHead; h != nil {
		qr.OldestHead = &OldestHead{TenantID: h.TenantID, OrderingKey: h.OrderingKey, MessageID: h.MessageID.String(), AgeSeconds: h.Age.Seconds()}
	}
	if qr.Overdue, err = overdue(ctx, store, q, opts.MaxOldestDue); err != nil {
		return fmt.Errorf("doctor: %w", err)
	}
	kept, err := store.Retained(ctx)
	if err != nil {
		return fmt.Errorf("doctor: %w", err)
	}
	qr.RetainedSeconds = kept.FinishedWindow().Seconds()
	if kept.OldestDeadLettered != nil {
		qr.RetainedDeadSeconds = kept.Now.Sub(*kept.OldestDeadLettered).Seconds()
	}

	switch {
	case qr.Overdue && qr.wholeQueuePaused() != nil: // paused on purpose: warnPausedBacklog says so
	case qr.Overdue:
		n.problem(msgOverdue, opts.MaxOldestDue, round(stats.OldestDueAge))
	}
	warnPausedBacklog(q, qr, n)
	if qr.ExpiredLeases > 0 {
		n.warn(msgExpired, plural.Count(qr.ExpiredLeases, msgExpiredOne, msgExpiredMany))
	}
	if qr.DeadLettered > 0 {
		n.warn(msgDeadLetters, plural.Count(qr.DeadLettered, msgDeadOne, msgDeadMany), q)
	}
	if h := stats.WaitingHead; h != nil && h.Age > opts.MaxOldestDue {
		n.warn(msgKeyHeld, h.OrderingKey, h.TenantID, h.MessageID, round(h.Age),
			plural.Count(qr.Waiting, msgWaitingOne, msgWaitingMany), headHeld(ctx, store, h.MessageID), q)
	}

	if schemaBehind {
		n.warn(msgClaimNotYetChecked)
		return nil
	}
	return checkClaim(ctx, store, q, opts, rows, qr, n)
}

// overdue reports whether a message of q has been due for longer than
// minDue. Time spent deferred, waiting on a retry delay or leased is not
// waiting, so the oldest row's age alone would raise false alarms. It
// reads the queue table READ COMMITTED and read only, as the store's
// statements run, whatever the defaults.
func overdue(ctx context.Context, store *leasing.Postgres, q leasing.Queue, minDue time.Duration) (late bool, err error) {
	g := gen.New()
	query := g.DiagnosticsInboxOverdue
	if q == leasing.Outbox {
		query = func(ctx context.Context, db gen.DBTX, p gen.DiagnosticsInboxOverdueParams) (bool, error) {
			return g.DiagnosticsOutboxOverdue(ctx, db, gen.DiagnosticsOutboxOverdueParams(p))
		}
	}
	err = pgx.BeginTxFunc(ctx, store.Pool(), pgx.TxOptions{IsoLevel: pgx.ReadCommitted, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) (err error) {
		late, err = query(ctx, tx, gen.DiagnosticsInboxOverdueParams{MinDue: minDue})
		return err
	})
	return late, err
}

// headHeld says why head holds its key, from its state: pending and not
// claimed (or not due yet), failed and waiting out its retry delay, in
// flight, dead-lettered under strict ordering, or parked by the claim with
// its key held (under strict ordering, or because freeing it failed:
// ParkedError.KeysNotFreed). A head Get cannot read (a row with an
// infinite time, which the claim parks) gets the causes a dead letter can
// have.
func headHeld(ctx context.Context, store *leasing.Postgres, head uuid.UUID) string {
	row, err := store.Get(ctx, head)
	if err != nil {
		return fmt.Sprintf(msgHeadUnreadable, err.Error())
	}
	switch row.Status {
	case leasing.StatusPending:
		if row.VisibleAfter.After(time.Now()) {
			return fmt.Sprintf(msgHeadNotDue, row.VisibleAfter.UTC().Format(time.RFC3339))
		}
		return msgHeadPending
	case leasing.StatusFailed:
		return msgHeadRetrying
	case leasing.StatusDeadLettered:
	default:
		return fmt.Sprintf(msgHeadInFlight, string(row.Status))
	}
	strict, err := store.StrictOrdering(ctx)
	switch parked := strings.HasPrefix(row.LastError, parkedPrefix); {
	case err != nil:
		return msgHeadDead
	case parked && strict:
		return msgHeadParkedStrict
	case parked:
		return msgHeadParkedNotFreed
	case strict:
		return msgHeadDeadStrict
	default:
		return msgHeadDeadKeyHeld
	}
}

// parkedPrefix starts the last_error of a row the claim parked.
const parkedPrefix = "parked by the claim: "
