package leasing

import (
	"encoding/json"
	"fmt"
	"time"
	"unicode/utf8"
)

// AttemptHistoryLimit is how many entries a row's attempt history keeps:
// the latest 20; each append beyond that drops the oldest. db/render reads
// this constant into the SQL (db/queries/queue.sql.tmpl), so that both
// stores keep the same bound.
//
// What the bound costs: an entry takes about 220 bytes of jsonb (two
// timestamps, the owner, the keys), plus its error text (at most
// MaxAttemptErrorBytes), in the row version each outcome write makes
// anyway: no extra statement, index entry or table. A message that
// succeeds at its first attempt carries one entry. A full history of
// 50-byte errors is about 5.6 KiB before compression (PostgreSQL
// compresses and, past about 2 KiB, moves it out of the row: a full
// history of repeated errors stores in under 1 KiB); the worst case, 20
// distinct errors of 1 KiB, is about 25 KiB per row, which every write of
// that row then copies.
const AttemptHistoryLimit = 20

// MaxAttemptErrorBytes is the longest error text one history entry keeps,
// in bytes of UTF-8; longer texts are cut on a rune boundary. The full
// text of the latest failure stays in Row.LastError (MaxErrorBytes).
const MaxAttemptErrorBytes = 1 << 10

// AttemptOutcome is how one attempt in a row's history ended.
type AttemptOutcome string

// The attempt outcomes, spelled as stored.
const (
	// AttemptCompleted: the inbox handler succeeded (Complete).
	AttemptCompleted AttemptOutcome = "completed"
	// AttemptPublished: the outbox message was published (Complete).
	AttemptPublished AttemptOutcome = "published"
	// AttemptFailed: Fail wrote failed; the message is retried.
	AttemptFailed AttemptOutcome = "failed"
	// AttemptReleased: Release or ReleaseOrphans gave the lease back; the
	// attempt was not counted.
	AttemptReleased AttemptOutcome = "released"
	// AttemptDeadLettered: DeadLetter wrote dead_lettered, or an operator
	// did (Operator is then true).
	AttemptDeadLettered AttemptOutcome = "dead_lettered"
	// AttemptExpired: the lease expired and a claim took the message over;
	// written by that claim.
	AttemptExpired AttemptOutcome = "expired"
	// AttemptRequeued: not an attempt but a marker: an operator requeued
	// the dead-lettered message, and attempt numbers start again at 1.
	AttemptRequeued AttemptOutcome = "requeued"
)

// Attempt is one entry of a row's attempt history (Row.Attempts): one
// finished lease, or an operator's action on the message. Times are the
// database clock (the store's clock for Memory), in UTC, to the microsecond.
type Attempt struct {
	// Attempt is the attempt number the claim gave the lease (Lease.Attempt):
	// 1 on the first delivery. For an operator's entry, the attempts counted
	// so far.
	Attempt int `json:"attempt"`
	// Generation is the lease's generation (Lease.Generation); 0 for an
	// operator's entry on a message no lease held.
	Generation int64 `json:"generation"`
	// Owner is the lease's owner; empty when no lease held the message.
	Owner string `json:"owner,omitempty"`
	// ClaimedAt is when the claim took the lease; nil when no lease held
	// the message.
	ClaimedAt *time.Time `json:"claimed_at,omitempty"`
	// FinishedAt is when the entry was written; for an expired attempt,
	// when its lease expired.
	FinishedAt time.Time `json:"finished_at"`
	// Outcome is how the attempt ended.
	Outcome AttemptOutcome `json:"outcome"`
	// Error is the failure's error text, cut to MaxAttemptErrorBytes, or the
	// operator's reason; empty for other outcomes.
	Error string `json:"error,omitempty"`
	// Operator is true when an operator wrote the entry (DeadLetterByID,
	// Requeue), not the lease's holder. Retried writes of a lease never
	// count an operator's entry as theirs.
	Operator bool `json:"operator,omitempty"`
	// Forced is true when the operator dead-lettered the message while a
	// live lease held it (DeadLetterByIDRequest.Force); that lease is fenced.
	Forced bool `json:"forced,omitempty"`
}

// String describes the attempt on one line for logs and the CLI.
func (a Attempt) String() string {
	s := fmt.Sprintf("#%d %s at %s", a.Attempt, a.Outcome, a.FinishedAt.Format(time.RFC3339Nano))
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

// decodeAttempts reads a stored attempts column: a JSON array of entries.
// Times come back in UTC.
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

// appendAttempt returns history with a appended, keeping the last
// AttemptHistoryLimit entries, in a new slice.
func appendAttempt(history []Attempt, a Attempt) []Attempt {
	keep := min(len(history), AttemptHistoryLimit-1)
	out := make([]Attempt, 0, keep+1)
	out = append(out, history[len(history)-keep:]...)
	return append(out, a)
}

// wrote reports whether history holds an entry in which the lease of owner
// and generation itself (not an operator) recorded outcome.
func wrote(history []Attempt, owner string, generation int64, outcome AttemptOutcome) bool {
	for _, a := range history {
		if a.Generation == generation && a.Owner == owner && a.Outcome == outcome && !a.Operator {
			return true
		}
	}
	return false
}
