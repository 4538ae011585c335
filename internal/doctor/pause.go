package doctor

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/leasestore/leasestore/leasing"
)

// PauseState is one pause in place on a queue (leasectl pause,
// leasing.Postgres.Pause).
type PauseState struct {
	// Topic is the paused topic; empty for the whole queue.
	Topic string `json:"topic"`
	// By is who paused it; At when, by the database's clock (UTC).
	By string    `json:"by"`
	At time.Time `json:"at"`
}

// checkPauses reads q's pauses into qr.Paused (leasing.Postgres.Paused).
// A pause is the operator's choice, so it is information, not a problem;
// none is read on a schema before migration 00015 (checkMigrations
// reports it), and a role that may not read them gets a warning.
func checkPauses(ctx context.Context, store *leasing.Postgres, schemaBehind bool, qr *QueueReport, n notes) error {
	paused, err := store.Paused(ctx)
	switch {
	case err != nil && schemaBehind: // leasestore_paused may not exist yet
		return nil
	case errors.Is(err, leasing.ErrPermissionDenied):
		n.warn(msgPausesUnreadable, err)
		return nil
	case err != nil:
		return fmt.Errorf("doctor: %w", err)
	}
	for _, p := range paused {
		qr.Paused = append(qr.Paused, PauseState{Topic: p.Topic, By: p.By, At: p.At.UTC()})
	}
	return nil
}

// wholeQueuePaused returns the whole-queue pause of qr, or nil.
func (qr *QueueReport) wholeQueuePaused() *PauseState {
	for i, p := range qr.Paused {
		if p.Topic == "" {
			return &qr.Paused[i]
		}
	}
	return nil
}

// warnPausedBacklog warns when the whole queue is paused while messages
// are due (or leases expired): nothing drains it until leasectl resume.
// It is a warning, not a problem: the pause is deliberate, but one left in
// place by mistake stops the queue, so the report says so. The overdue
// check yields to it (checkBacklog).
func warnPausedBacklog(q leasing.Queue, qr *QueueReport, n notes) {
	p := qr.wholeQueuePaused()
	if p == nil || (qr.OldestDueSeconds == 0 && qr.ExpiredLeases == 0) {
		return
	}
	n.warn(msgQueuePausedDue, p.By, p.At.Format(time.RFC3339), round(time.Duration(qr.OldestDueSeconds*float64(time.Second))), q)
}
