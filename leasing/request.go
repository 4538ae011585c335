package leasing

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
)

// Limits enforced by both stores before any statement runs.
const (
	// MaxBatchSize is the most rows one claim, enqueue, write or requeue takes.
	MaxBatchSize = 10_000
	// MaxLeaseDuration is the longest lease a claim or renew grants.
	MaxLeaseDuration = 24 * time.Hour
	// MaxOwnerBytes is the longest lease owner name, in bytes of UTF-8.
	MaxOwnerBytes = 200
	// MaxPayloadBytes is the largest message payload, in bytes.
	MaxPayloadBytes = 1 << 20
	// MaxErrorBytes is the longest last_error; longer texts are cut.
	MaxErrorBytes = 8 << 10
	// MaxDelay is the longest enqueue delay or retry delay.
	MaxDelay = 365 * 24 * time.Hour
	// MaxOrderingKeyBytes is the longest NewMessage.OrderingKey, in bytes.
	MaxOrderingKeyBytes = 256
	// MaxTenantIDBytes is the longest tenant id, in bytes (an index key).
	MaxTenantIDBytes = 256
	// MaxIdempotencyKeyBytes is the longest idempotency key, in bytes (an
	// index key).
	MaxIdempotencyKeyBytes = 256
	// MaxClaimTopics is the most topics one ClaimRequest names in Topics,
	// and the most in ExceptTopics.
	MaxClaimTopics = 100
	// MaxTopicBytes is the longest topic (or message type) a ClaimRequest
	// or a PauseRequest names, and a NewMessage holds, in bytes.
	MaxTopicBytes = 256
)

// ClaimRequest asks for leases on up to BatchSize due messages.
type ClaimRequest struct {
	// Owner is the lease owner, 1..MaxOwnerBytes bytes of UTF-8; use
	// NewOwner to make one that is unique per process.
	Owner string
	// BatchSize is the most rows to claim, 1..MaxBatchSize.
	BatchSize int
	// LeaseFor is how long each lease lasts, 1µs..MaxLeaseDuration.
	LeaseFor time.Duration
	// TenantID, when not empty, claims only that tenant's rows.
	TenantID string
	// Topics, when not empty, claims only messages of these topics, in
	// FIFO order within them. On the outbox a message's topic is its
	// NewMessage.Topic; on the inbox, which has no topics, it is its
	// NewMessage.Type: both name what a message is for, and one field lets
	// a processor serve either queue by the same option. Each is 1..
	// MaxTopicBytes bytes of UTF-8 without NUL, none twice, at most
	// MaxClaimTopics; messages of the empty topic (or type) are claimed
	// only by a claim without Topics. A claim reads each topic's due rows
	// through its own index (db migration 00016): its cost grows with
	// len(Topics) x BatchSize, not with other topics' backlog.
	Topics []string
	// ExceptTopics claims no message of these topics (types on the inbox),
	// with the same rules as Topics; a topic may not be in both. A
	// processor's per-topic breaker stops claiming a topic this way.
	ExceptTopics []string
}

// Validate returns nil when r can run.
//
// Errors: an *ArgumentError naming the first bad field.
func (r ClaimRequest) Validate() error {
	if err := validateOwner(r.Owner); err != nil {
		return err
	}
	if r.BatchSize < 1 || r.BatchSize > MaxBatchSize {
		return argumentError("batch size", "must be 1..%d, got %d", MaxBatchSize, r.BatchSize)
	}
	if err := validateLeaseFor(r.LeaseFor); err != nil {
		return err
	}
	if !validText(r.TenantID) {
		return argumentError("tenant id", "must be UTF-8 without NUL")
	}
	if len(r.TenantID) > MaxTenantIDBytes {
		return argumentError("tenant id", "must be at most %d bytes, got %d", MaxTenantIDBytes, len(r.TenantID))
	}
	if err := validateTopics("topics", r.Topics); err != nil {
		return err
	}
	if err := validateTopics("except topics", r.ExceptTopics); err != nil {
		return err
	}
	for _, t := range r.ExceptTopics {
		if slices.Contains(r.Topics, t) {
			return argumentError("except topics", "must not name a topic of topics, got %q in both", t)
		}
	}
	return nil
}

// validateTopics checks a list of topics (message types on the inbox):
// at most MaxClaimTopics, each 1..MaxTopicBytes bytes of UTF-8 without NUL,
// none twice.
func validateTopics(field string, topics []string) error {
	if len(topics) > MaxClaimTopics {
		return argumentError(field, "must name at most %d topics, got %d", MaxClaimTopics, len(topics))
	}
	seen := make(map[string]bool, len(topics))
	for i, t := range topics {
		if err := validateTopic(field, t); err != nil {
			return err
		}
		if seen[t] {
			return argumentError(field, "must not name a topic twice, got %q at %d", t, i)
		}
		seen[t] = true
	}
	return nil
}

// validateTopic checks one topic (a message type on the inbox): 1..
// MaxTopicBytes bytes of UTF-8 without NUL.
func validateTopic(field, t string) error {
	switch {
	case t == "":
		return argumentError(field, "must not hold an empty topic")
	case len(t) > MaxTopicBytes:
		return argumentError(field, "must hold topics of at most %d bytes, got %d", MaxTopicBytes, len(t))
	case !validText(t):
		return argumentError(field, "must hold topics of UTF-8 without NUL")
	}
	return nil
}

// NewMessage is a message to enqueue.
type NewMessage struct {
	// ID is the message_id; the zero UUID asks for a new UUIDv7.
	ID uuid.UUID
	// Type is the application's message type name; may be empty. At most
	// MaxTopicBytes of UTF-8 without NUL.
	Type string
	// Payload is the body, 0..MaxPayloadBytes bytes; nil is stored as empty.
	Payload []byte
	// Headers is a JSON object or empty (stored as {}), as PostgreSQL's
	// jsonb stores it: UTF-8, no \u0000 or unpaired surrogate escape in
	// its strings, numbers of at most 131,072 digits before the decimal
	// point and 16,383 after (numeric's limits). A store with a
	// TracerProvider adds the trace headers (HeaderTraceParent) unless
	// the object holds them already.
	Headers json.RawMessage
	// TenantID is empty for no tenant; at most MaxTenantIDBytes.
	TenantID string
	// IdempotencyKey deduplicates inbox messages per tenant; it must be empty
	// on the outbox. At most MaxIdempotencyKeyBytes.
	IdempotencyKey string
	// Topic is the outbox destination, at most MaxTopicBytes of UTF-8
	// without NUL; it must be empty on the inbox.
	Topic string
	// OrderingKey, when not empty, makes the messages of one key and
	// tenant run one at a time, in enqueue order. UTF-8 without NUL.
	OrderingKey string
	// Delay defers the first claim by this long from the store's now,
	// 0..MaxDelay.
	Delay time.Duration
}

// Failure is the outcome of a failed attempt, for Fail and DeadLetter.
type Failure struct {
	// Lease is the lease the attempt ran under.
	Lease Lease
	// RetryAfter is how long the message stays invisible, 0..MaxDelay.
	RetryAfter time.Duration
	// Error is the text stored in last_error. NUL bytes and invalid UTF-8 are
	// replaced with U+FFFD and the text is cut to MaxErrorBytes.
	Error string
}

func validateOwner(owner string) error {
	switch {
	case owner == "":
		return argumentError("owner", "must not be empty")
	case len(owner) > MaxOwnerBytes:
		return argumentError("owner", "must be at most %d bytes, got %d", MaxOwnerBytes, len(owner))
	case !utf8.ValidString(owner):
		return argumentError("owner", "must be valid UTF-8")
	}
	for _, r := range owner {
		if r == 0 {
			return argumentError("owner", "must not contain NUL")
		}
	}
	return nil
}

func validateLeaseFor(d time.Duration) error {
	if d < time.Microsecond || d > MaxLeaseDuration {
		return argumentError("lease duration", "must be 1µs..%s, got %s", MaxLeaseDuration, d)
	}
	return nil
}

// ValidateDelay returns nil when d is a valid delay: an enqueue delay or a
// retry delay, 0..MaxDelay.
//
// Errors: an *ArgumentError naming field.
func ValidateDelay(field string, d time.Duration) error {
	if d < 0 || d > MaxDelay {
		return argumentError(field, "must be 0..%s, got %s", MaxDelay, d)
	}
	return nil
}

// ValidatePositive returns nil when v > 0: a count, or a duration such as
// an interval or an age, that must be positive.
//
// Errors: an *ArgumentError naming field.
func ValidatePositive[T ~int | ~int64](field string, v T) error {
	if v <= 0 {
		return argumentError(field, "must be positive, got %v", v)
	}
	return nil
}

func validateCount(field string, n int) error {
	if n < 1 || n > MaxBatchSize {
		return argumentError(field, "must hold 1..%d items, got %d", MaxBatchSize, n)
	}
	return nil
}

// validateMessages checks msgs for queue q and returns them with IDs,
// headers and payloads filled in. The input slice is not modified.
func validateMessages(q Queue, msgs []NewMessage) ([]NewMessage, error) {
	if err := validateCount("messages", len(msgs)); err != nil {
		return nil, err
	}
	out := make([]NewMessage, len(msgs))
	seen := make(map[uuid.UUID]bool, len(msgs))
	idemKeys := map[[2]string]string{}
	for i, m := range msgs {
		switch {
		case len(m.Payload) > MaxPayloadBytes:
			return nil, argumentError("payload", "must be at most %d bytes, got %d (message %d)", MaxPayloadBytes, len(m.Payload), i)
		case q == Outbox && m.IdempotencyKey != "":
			return nil, argumentError("idempotency key", "is an inbox field; message %d is for the outbox", i)
		case q == Inbox && m.Topic != "":
			return nil, argumentError("topic", "is an outbox field; message %d is for the inbox", i)
		}
		if len(m.Headers) > 0 {
			if why := unstorableHeaders(m.Headers); why != "" {
				return nil, argumentError("headers", "message %d: %s", i, why)
			}
		}
		for _, f := range [...]struct {
			field, text string
			max         int // bytes
		}{
			{"type", m.Type, MaxTopicBytes}, {"tenant id", m.TenantID, MaxTenantIDBytes},
			{"idempotency key", m.IdempotencyKey, MaxIdempotencyKeyBytes}, {"topic", m.Topic, MaxTopicBytes},
		} {
			switch {
			case !validText(f.text):
				return nil, argumentError(f.field, "must be UTF-8 without NUL (message %d)", i)
			case len(f.text) > f.max:
				return nil, argumentError(f.field, "must be at most %d bytes, got %d (message %d)", f.max, len(f.text), i)
			}
		}
		if err := validateOrderingKey(i, m.OrderingKey); err != nil {
			return nil, err
		}
		if err := ValidateDelay("delay", m.Delay); err != nil {
			return nil, err
		}
		if m.ID == uuid.Nil {
			id, err := uuid.NewV7()
			if err != nil {
				return nil, err
			}
			m.ID = id
		}
		if seen[m.ID] {
			return nil, argumentError("message id", "%s appears twice", m.ID)
		}
		seen[m.ID] = true
		if q == Inbox && m.IdempotencyKey != "" {
			k := [2]string{m.TenantID, m.IdempotencyKey}
			if key, ok := idemKeys[k]; ok && key != m.OrderingKey {
				return nil, argumentError("ordering key", "message %d repeats an earlier message's idempotency key with another ordering key", i)
			} else if !ok {
				idemKeys[k] = m.OrderingKey
			}
		}
		if len(m.Headers) == 0 {
			m.Headers = json.RawMessage("{}")
		}
		if m.Payload == nil {
			m.Payload = []byte{}
		}
		out[i] = m
	}
	return out, nil
}

// validateLeases checks that leases is a non-empty batch of distinct
// messages of queue q held by one owner, and returns that owner.
func validateLeases(q Queue, leases []Lease) (string, error) {
	if err := validateCount("leases", len(leases)); err != nil {
		return "", err
	}
	owner := leases[0].Owner
	seen := make(map[uuid.UUID]bool, len(leases))
	for _, l := range leases {
		switch {
		case l.Queue != q:
			return "", argumentError("lease", "%s is from the %s queue, not %s", l.Message.ID, l.Queue, q)
		case l.Owner != owner:
			return "", argumentError("lease", "one batch must hold one owner's leases, got %q and %q", owner, l.Owner)
		case seen[l.Message.ID]:
			return "", argumentError("lease", "%s appears twice", l.Message.ID)
		case l.Generation < 1:
			return "", argumentError("lease", "%s has generation %d; leases come from Claim", l.Message.ID, l.Generation)
		}
		seen[l.Message.ID] = true
	}
	return owner, validateOwner(owner)
}

func validateFailures(q Queue, failures []Failure) (string, error) {
	leases := make([]Lease, len(failures))
	for i, f := range failures {
		if err := ValidateDelay("retry delay", f.RetryAfter); err != nil {
			return "", err
		}
		leases[i] = f.Lease
	}
	return validateLeases(q, leases)
}

func validateIDs(ids []uuid.UUID) error {
	if err := validateCount("message ids", len(ids)); err != nil {
		return err
	}
	seen := make(map[uuid.UUID]bool, len(ids))
	for _, id := range ids {
		if id == uuid.Nil {
			return argumentError("message ids", "must not hold the nil UUID, which names no message")
		}
		if seen[id] {
			return argumentError("message ids", "%s appears twice", id)
		}
		seen[id] = true
	}
	return nil
}

func validText(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] == 0 {
			return false
		}
	}
	return true
}

func isJSONObject(b json.RawMessage) bool {
	var m map[string]json.RawMessage
	return json.Unmarshal(b, &m) == nil && m != nil
}

// unstorableHeaders returns why PostgreSQL's jsonb would refuse b, or ""
// when it takes it: b must be a UTF-8 JSON object whose strings hold no
// U+0000 and no unpaired surrogate escape, and whose numbers fit numeric
// (at most numericMaxWeight digits before the decimal point and
// numericMaxScale after it). Go's decoder accepts all of these.
func unstorableHeaders(b json.RawMessage) string {
	if !utf8.Valid(b) {
		return "must be UTF-8"
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var obj map[string]any
	if dec.Decode(&obj) != nil || obj == nil {
		return "must be a JSON object"
	}
	if _, err := dec.Token(); err != io.EOF {
		return "must be a JSON object" // more after the object
	}
	if why := unstorableEscapes(b); why != "" {
		return why
	}
	return unstorableNumbers(obj)
}

// unstorableEscapes returns why jsonb refuses the \u escapes of the JSON
// text b, or "": \u0000, a high surrogate not followed by a low one, and a
// low one not preceded by a high one.
func unstorableEscapes(b []byte) string {
	const unpaired = "must not hold an unpaired UTF-16 surrogate escape"
	inString, high := false, false // high: the escape just before was a high surrogate
	for i := 0; i < len(b); i++ {
		switch {
		case !inString:
			inString = b[i] == '"'
			continue
		case b[i] != '\\' || b[i+1] != 'u':
			if high {
				return unpaired
			}
			if b[i] == '\\' {
				i++ // an escaped character
			} else {
				inString = b[i] != '"'
			}
			continue
		}
		code, _ := strconv.ParseUint(string(b[i+2:i+6]), 16, 32) // b decoded: four hex digits
		i += 5
		isHigh, isLow := code >= 0xD800 && code < 0xDC00, code >= 0xDC00 && code < 0xE000
		switch {
		case code == 0:
			return "must not hold \\u0000, which PostgreSQL's jsonb refuses"
		case high != isLow:
			return unpaired
		}
		high = isHigh
	}
	return ""
}

// PostgreSQL's numeric limits on a value jsonb stores: digits before the
// decimal point, and after it.
const (
	numericMaxWeight = 131072
	numericMaxScale  = 16383
)

// unstorableNumbers returns why numeric refuses a number of v (decoded
// with UseNumber), or "".
func unstorableNumbers(v any) string {
	switch v := v.(type) {
	case map[string]any:
		for _, e := range v {
			if why := unstorableNumbers(e); why != "" {
				return why
			}
		}
	case []any:
		for _, e := range v {
			if why := unstorableNumbers(e); why != "" {
				return why
			}
		}
	case json.Number:
		if !numericFits(string(v)) {
			return fmt.Sprintf("must not hold the number %.40s, beyond PostgreSQL's numeric (%d digits before the decimal point, %d after)",
				v, numericMaxWeight, numericMaxScale)
		}
	}
	return ""
}

// numericFits reports whether the JSON number n fits numeric: at most
// numericMaxScale digits after the decimal point, and, unless it is zero,
// at most numericMaxWeight before it.
func numericFits(n string) bool {
	n = strings.TrimPrefix(n, "-")
	mantissa, exp := n, int64(0)
	if i := strings.IndexAny(n, "eE"); i >= 0 {
		mantissa = n[:i]
		e, err := strconv.ParseInt(strings.TrimPrefix(n[i+1:], "+"), 10, 64)
		if err != nil {
			return false // an exponent beyond int64 is beyond numeric too
		}
		exp = e
	}
	intPart, frac, _ := strings.Cut(mantissa, ".")
	if int64(len(frac))-exp > numericMaxScale {
		return false
	}
	digits := intPart + frac
	first := strings.IndexFunc(digits, func(r rune) bool { return r != '0' })
	if first < 0 {
		return true // zero
	}
	return int64(len(intPart)-first)+exp <= numericMaxWeight
}

// SanitizeError returns text as stored in last_error: invalid UTF-8 and NUL
// bytes replaced by U+FFFD, cut to at most MaxErrorBytes on a rune boundary.
func SanitizeError(text string) string {
	var b []byte
	for _, r := range text {
		if r == 0 {
			r = utf8.RuneError
		}
		if len(b)+utf8.RuneLen(r) > MaxErrorBytes {
			break
		}
		b = utf8.AppendRune(b, r)
	}
	return string(b)
}

// leasesOf returns the lease of each failure, in order.
func leasesOf(failures []Failure) []Lease {
	leases := make([]Lease, len(failures))
	for i, f := range failures {
		leases[i] = f.Lease
	}
	return leases
}

// PurgeRequest selects terminal rows to delete.
type PurgeRequest struct {
	// OlderThan is the minimum age of the finish time, > 0.
	OlderThan time.Duration
	// BatchSize is the most rows one call deletes, 1..MaxBatchSize.
	BatchSize int
	// IncludeDeadLettered also deletes dead-lettered rows by their
	// dead-letter time; by default they are kept for requeue.
	IncludeDeadLettered bool
}

func (r PurgeRequest) validate() error {
	if err := ValidatePositive("older than", r.OlderThan); err != nil {
		return err
	}
	return validateCount("purge batch", r.BatchSize)
}
