package leasing

import (
	"encoding/json"
	"fmt"
	"time"
	"unicode/utf8"
)

// AttemptHistoryLimit is how many entries a row's attempt history keeps;
// each append beyond it drops the oldest. The SQL keeps the same bound.
// Its cost per row: docs/notes/2026-12-01-attempt-history.md.
const AttemptHistoryLimit = 20

// MaxAttemptErrorBytes is the longest error text one history entry keeps,
// cut on a rune boundary; Row.LastError keeps up to MaxErrorBytes.
const MaxAttemptErrorBytes = 1 << 10

// AttemptEnd is how one attempt in a row's history ended.
type AttemptEnd string

// The attempt outcomes, spelled as stored.
const (
	// AttemptCompleted: the inbox handler succeeded (Complete).
	AttemptCompleted AttemptEnd = "completed"
	// AttemptPublished: the outbox message was published (Complete).
	AttemptPublished AttemptEnd = "published"
	// AttemptFailed: Fail wrote failed; the message is retried.
	AttemptFailed AttemptEnd = "failed"
	// AttemptReleased: Release or ReleaseOrphans gave the lease back
	// (not counted).
	AttemptReleased AttemptEnd = "released"
	// AttemptDeadLettered: DeadLetter or an operator wrote dead_lettered.
	AttemptDeadLettered AttemptEnd = "dead_lettered"
	// AttemptExpired: the lease expired; the claim that took over wrote it.
	AttemptExpired AttemptEnd = "expired"
	// AttemptRequeued: an operator requeued the dead letter; attempt
	// numbers start again at 1.
	AttemptRequeued AttemptEnd = "requeued"
)

// Attempt is one entry of a row's attempt history (Row.Attempts): one
// finished lease, or an operator's action. Times are the store's clock, UTC.
type Attempt struct {
	// Attempt is Lease.Attempt; for an operator's entry, the attempts so far.
	Attempt int `json:"attempt"`
	// Generation is Lease.Generation; 0 when no lease held the message.
	Generation int64 `json:"generation"`
	// Owner is the lease's owner; empty when no lease held the message.
	Owner string `json:"owner,omitempty"`
	// ClaimedAt is when the claim took the lease; nil when none held it.
	ClaimedAt *time.Time `json:"claimed_at,omitempty"`
	// FinishedAt is when the entry was written (expired: the lease's end).
	FinishedAt time.Time `json:"finished_at"`
	// End is how the attempt ended; stored under the key "outcome".
	End AttemptEnd `json:"outcome"`
	// Error is the failure's text (MaxAttemptErrorBytes) or the operator's
	// reason.
	Error string `json:"error,omitempty"`
	// Operator: DeadLetterByID or Requeue wrote it, not the lease's holder;
	// a retried write never counts it as its own.
	Operator bool `json:"operator,omitempty"`
	// Forced: dead-lettered under a live lease (DeadLetterByIDRequest.Force).
	Forced bool `json:"forced,omitempty"`
}

// String describes the attempt on one line for logs and the CLI.
func (a Attempt) String() string {
	s := fmt.Sprintf("#%d %s at %s", a.Attempt, a.End, a.FinishedAt.Format(time.RFC3339Nano))
	if a.Owner != "" {
		s += fmt.Sprintf(" lease %s#%d", a.Owner, a.Generation)
	}
	if a.Operator {
		s += " by operator"
	}
	if a.Forced {
		s += " (forced)"
	}
	if a.Error != "" {
		s += fmt.Sprintf(": %q", a.Error)
	}
	return s
}

// attemptError returns text as one history entry keeps it: SanitizeError,
// then cut to MaxAttemptErrorBytes on a rune boundary.
func attemptError(text string) string {
	s := SanitizeError(text)
	if len(s) <= MaxAttemptErrorBytes {
		return s
	}
	cut := MaxAttemptErrorBytes
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut]
}

// decodeAttempts reads a stored attempts column, times in UTC.
func decodeAttempts(raw []byte) ([]Attempt, error) {
	out := []Attempt{}
	if len(raw) == 0 {
		return out, nil
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		return nil, fmt.Errorf("leasing: attempts column: %w", err)
	}
	for i := range out {
		out[i].FinishedAt = out[i].FinishedAt.UTC()
		out[i].ClaimedAt = utc(out[i].ClaimedAt)
	}
	return out, nil
}

// appendAttempt returns a new slice: the last AttemptHistoryLimit of
// history and a.
func appendAttempt(history []Attempt, a Attempt) []Attempt {
	keep := min(len(history), AttemptHistoryLimit-1)
	out := make([]Attempt, 0, keep+1)
	out = append(out, history[len(history)-keep:]...)
	return append(out, a)
}

// withFinalAttempt returns row's history with the entry of the attempt
// that completed (inbox) or published (outbox) it, which Complete leaves
// in the row's lease columns rather than in attempts: appended, within
// AttemptHistoryLimit, unless the history already holds it (rows finished
// by earlier versions, which stored it). Other rows' history is returned
// as it is.
func withFinalAttempt(q Queue, row Row) []Attempt {
	done := AttemptEnd(q.Succeeded())
	if row.Status != q.Succeeded() || row.FinishedAt == nil ||
		wrote(row.Attempts, row.LeaseOwner, row.LeaseGeneration, done) {
		return row.Attempts
	}
	return appendAttempt(row.Attempts, Attempt{
		Attempt:    row.AttemptCount,
		Generation: row.LeaseGeneration,
		Owner:      row.LeaseOwner,
		ClaimedAt:  row.LastAttemptedAt,
		FinishedAt: *row.FinishedAt,
		End:        done,
	})
}

// wrote reports whether the lease (owner, generation) itself recorded
// outcome in history.
func wrote(history []Attempt, owner string, generation int64, outcome AttemptEnd) bool {
	for _, a := range history {
		if a.Generation == generation && a.Owner == owner && a.End == outcome && !a.Operator {
			return true
		}
	}
	return false
}
