package leasing

import (
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/leasestore/leasestore/gen"
)

// mapErr translates driver errors into leasing's: SQLSTATE LS001 (an inbox
// duplicate of another ordering key) to an *OrderingKeyConflictError, a
// unique violation to ErrDuplicate with the server's detail, pgx.ErrNoRows
// to ErrNotFound, lock_not_available (55P03) to ErrLockTimeout and
// insufficient_privilege (42501) to ErrPermissionDenied, and a read-only
// server (25006) or one shutting down or starting (57P01, 57P02, 57P03) to
// ErrUnavailable, each wrapping the server's error. Other errors, and
// errors it already mapped, pass unchanged.
func mapErr(err error) error {
	var pgErr *pgconn.PgError
	switch {
	case err == nil, errors.Is(err, ErrLockTimeout), errors.Is(err, ErrPermissionDenied), errors.Is(err, ErrUnavailable):
		return err
	case errors.As(err, &pgErr) && (pgErr.Code == "25006" || pgErr.Code == "57P01" || pgErr.Code == "57P02" || pgErr.Code == "57P03"):
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	case errors.As(err, &pgErr) && pgErr.Code == "55P03":
		return fmt.Errorf("%w: %w", ErrLockTimeout, err)
	case errors.As(err, &pgErr) && pgErr.Code == "42501":
		return fmt.Errorf("%w: %w", ErrPermissionDenied, err)
	case errors.As(err, &pgErr) && pgErr.Code == "LS001":
		id, _ := uuid.Parse(pgErr.Detail)
		return &OrderingKeyConflictError{ID: id}
	case errors.As(err, &pgErr) && pgErr.Code == "23505":
		return fmt.Errorf("%w: %s", ErrDuplicate, pgErr.Detail)
	case errors.Is(err, pgx.ErrNoRows):
		return ErrNotFound
	}
	return err
}

// claimed converts the rows of a claim for owner: a row with a parked
// reason was parked by the claim (its other columns are placeholders),
// every other row is a lease. Both keep the rows' order; leases is never
// nil.
func claimed(q Queue, owner string, rows []*gen.InboxClaimRow) (leases []Lease, parked []ParkedRow) {
	leases = make([]Lease, 0, len(rows))
	for _, r := range rows {
		if r.ParkedReason != nil {
			parked = append(parked, ParkedRow{ID: r.MessageID, Reason: *r.ParkedReason})
			continue
		}
		leases = append(leases, Lease{
			Queue:      q,
			Owner:      owner,
			Generation: r.LeaseGeneration,
			ExpiresAt:  r.LeaseExpiresAt.UTC(),
			Attempt:    int(r.AttemptCount),
			LastError:  deref(r.LastError),
			DueAt:      r.DueAt.UTC(),
			Message: Message{
				ID: r.MessageID, Type: r.MessageType, Payload: r.Payload, Headers: r.Headers,
				TenantID: deref(r.TenantID), IdempotencyKey: deref(r.IdempotencyKey), Topic: r.Topic,
				OrderingKey: deref(r.OrderingKey), CreatedAt: r.CreatedAt.UTC(), VisibleAfter: r.VisibleAfter.UTC(),
			},
		})
	}
	return leases, parked
}

// rowOf converts a read row; the error is that of an attempts column that
// does not hold the history's JSON.
func rowOf(q Queue, r *gen.InboxGetRow) (Row, error) {
	attempts, err := decodeAttempts(r.Attempts)
	if err != nil {
		return Row{}, fmt.Errorf("%w: %s message %s", err, q, r.MessageID)
	}
	row := Row{
		Message: Message{
			ID: r.MessageID, Type: r.MessageType, Payload: r.Payload, Headers: r.Headers,
			TenantID: deref(r.TenantID), IdempotencyKey: deref(r.IdempotencyKey), Topic: r.Topic,
			OrderingKey: deref(r.OrderingKey), CreatedAt: r.CreatedAt.UTC(), VisibleAfter: r.VisibleAfter.UTC(),
		},
		Status:              Status(r.Status),
		LeaseOwner:          deref(r.LeaseOwner),
		LeaseExpiresAt:      utc(r.LeaseExpiresAt),
		LeaseGeneration:     r.LeaseGeneration,
		LastWriteGeneration: r.OutcomeGeneration,
		LastWrite:           deref(r.Outcome),
		AttemptCount:        int(r.AttemptCount),
		LastAttemptedAt:     utc(r.LastAttemptedAt),
		LastError:           deref(r.LastError),
		FinishedAt:          utc(r.FinishedAt),
		DeadLetteredAt:      utc(r.DeadLetteredAt),
		KeySeq:              r.KeySeq,
		Attempts:            attempts,
	}
	row.Attempts = withFinalAttempt(q, row)
	return row, nil
}

// outcomes returns the outcome of each of ids, in their order, from the
// rows of the fenced write of ids: a row for each message the write did
// not apply (Release: for each message), every other message applied.
func outcomes(ids []uuid.UUID, rows []*gen.InboxCompleteRow) []MessageOutcome {
	out := make([]MessageOutcome, len(ids))
	for i, id := range ids {
		out[i] = MessageOutcome{MessageID: id, Outcome: OutcomeApplied}
	}
	if len(rows) == 0 {
		return out
	}
	at := make(map[uuid.UUID]int, len(ids))
	for i, id := range ids {
		at[id] = i
	}
	for _, r := range rows {
		if i, ok := at[r.MessageID]; ok {
			out[i].Outcome = Outcome(r.Outcome)
		}
	}
	return out
}

// idTexts is ids as the text[] parameters of the queue queries, never nil:
// pgx encodes a []string in every query mode without knowing the
// parameter's type (see the Complete query in db/queries/write.sql.tmpl).
// The texts are substrings of one string: one allocation per call, not
// one per id.
func idTexts(ids []uuid.UUID) []string {
	const width = 36 // xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx, as uuid.UUID.String
	var all strings.Builder
	all.Grow(len(ids) * width)
	for _, id := range ids {
		var text [width]byte
		hex.Encode(text[0:8], id[0:4])
		hex.Encode(text[9:13], id[4:6])
		hex.Encode(text[14:18], id[6:8])
		hex.Encode(text[19:23], id[8:10])
		hex.Encode(text[24:36], id[10:16])
		text[8], text[13], text[18], text[23] = '-', '-', '-', '-'
		all.Write(text[:])
	}
	s := all.String()
	out := make([]string, len(ids))
	for i := range out {
		out[i] = s[i*width : (i+1)*width]
	}
	return out
}

// nullable is s as a nullable text parameter: nil for "".
func nullable(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// deref is a nullable text column as a string: "" for NULL.
func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// utc is a nullable timestamp column in UTC.
func utc(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}
