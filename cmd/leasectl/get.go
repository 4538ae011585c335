package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/leasestore/leasestore/console"
	"github.com/leasestore/leasestore/internal/plural"
	"github.com/leasestore/leasestore/leasing"
)

// idFlag registers --id on fs: one message id, required by the caller.
func idFlag(fs *flag.FlagSet, usage string) *uuid.UUID {
	id := new(uuid.UUID)
	set := false
	fs.Func("id", usage, func(s string) error {
		if set {
			return errors.New("give one --id")
		}
		parsed, err := parseID(s)
		if err != nil {
			return err
		}
		*id, set = parsed, true
		return nil
	})
	return id
}

// parseID parses the value of an --id flag: a UUID other than the nil
// UUID, which names no message (Enqueue gives a message a new id in its
// place, and DeadLetterByID refuses it).
func parseID(s string) (uuid.UUID, error) {
	id, err := uuid.Parse(s)
	switch {
	case err != nil:
		return uuid.Nil, errors.New("not a UUID")
	case id == uuid.Nil:
		return uuid.Nil, errors.New("must not be the nil UUID")
	}
	return id, nil
}

// rowJSON is one message as get --json prints it. Times are the database
// clock, UTC.
type rowJSON struct {
	Queue          leasing.Queue   `json:"queue"`
	MessageID      uuid.UUID       `json:"message_id"`
	Type           string          `json:"type"`
	TenantID       string          `json:"tenant_id,omitempty"`
	IdempotencyKey string          `json:"idempotency_key,omitempty"`
	Topic          string          `json:"topic,omitempty"`
	OrderingKey    string          `json:"ordering_key,omitempty"`
	KeySeq         int64           `json:"key_seq,omitempty"`
	Headers        json.RawMessage `json:"headers"`
	Payload        []byte          `json:"payload"`
	// PayloadJSON is the payload again when it is one JSON value, and
	// PayloadText when it is text (console.FormatPayload).
	PayloadJSON       json.RawMessage   `json:"payload_json,omitempty"`
	PayloadText       *string           `json:"payload_text,omitempty"`
	CreatedAt         time.Time         `json:"created_at"`
	VisibleAfter      time.Time         `json:"visible_after"`
	Status            leasing.Status    `json:"status"`
	LeaseOwner        string            `json:"lease_owner,omitempty"`
	LeaseExpiresAt    *time.Time        `json:"lease_expires_at,omitempty"`
	LeaseGeneration   int64             `json:"lease_generation"`
	AttemptCount      int               `json:"attempt_count"`
	LastAttemptedAt   *time.Time        `json:"last_attempted_at,omitempty"`
	LastError         string            `json:"last_error,omitempty"`
	FinishedAt        *time.Time        `json:"finished_at,omitempty"`
	DeadLetteredAt    *time.Time        `json:"dead_lettered_at,omitempty"`
	AttemptsKept      int               `json:"attempts_kept"`
	AttemptsKeptLimit int               `json:"attempts_kept_limit"`
	Attempts          []leasing.Attempt `json:"attempts"`
}

// runGet is "leasectl get".
func runGet(ctx context.Context, c *cli, args []string) error {
	fs := c.newFlagSet("get", "--queue inbox|outbox --id ID [--json]\n\n"+
		"Prints one message's stored state and its attempt history: the last\n"+
		fmt.Sprint(leasing.AttemptHistoryLimit)+" finished attempts, oldest first, each with its lease (owner and\n"+
		"generation), when it was claimed and finished, how it ended and its error.\n"+
		"Times are the database clock, UTC. The payload is shown when it is JSON\n"+
		"(indented) or text; --json adds it as base64, and as payload_json or\n"+
		"payload_text when it is one.")
	queue := fs.String("queue", "", "queue: inbox or outbox (required)")
	id := idFlag(fs, "message `ID` (required)")
	asJSON := fs.Bool("json", false, "print the message and its history as JSON")
	if err := c.parse(fs, args); err != nil {
		return err
	}
	q, err := parseQueue(*queue)
	if err != nil {
		return err
	}
	if *id == uuid.Nil {
		return usagef("--id is required")
	}

	store, err := c.lazyStore(q)
	if err != nil {
		return err
	}
	defer store.Pool().Close()
	row, err := store.Get(ctx, *id)
	if err != nil {
		return c.storeError(err)
	}
	if *asJSON {
		return writeJSON(c.stdout, rowJSONOf(q, row))
	}
	return printRow(c.stdout, q, row)
}

// printRow prints row as get does without --json.
func printRow(w io.Writer, q leasing.Queue, row leasing.Row) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	line := func(k, format string, args ...any) { fmt.Fprintf(tw, "%s\t"+format+"\n", append([]any{k}, args...)...) }
	line("message", "%s %s", q, row.ID)
	line("status", "%s", row.Status)
	if row.Type != "" {
		line("type", "%s", shown(row.Type))
	}
	if row.TenantID != "" {
		line("tenant", "%s", shown(row.TenantID))
	}
	if row.IdempotencyKey != "" {
		line("idempotency key", "%s", shown(row.IdempotencyKey))
	}
	if row.OrderingKey != "" {
		line("ordering key", "%s (key seq %d: its place in the key's enqueue order)", shown(row.OrderingKey), row.KeySeq)
	}
	if row.Topic != "" {
		line("topic", "%s", shown(row.Topic))
	}
	kind, payload := console.FormatPayload(row.Payload)
	switch kind {
	case console.PayloadBinary:
		line("payload", "%d bytes (binary)", len(row.Payload))
	default:
		line("payload", "%d bytes (%s, below)", len(row.Payload), kind)
	}
	line("created at", "%s", stamp(row.CreatedAt))
	line("visible after", "%s", stamp(row.VisibleAfter))
	line("attempts", "%d", row.AttemptCount)
	line("lease generation", "%d", row.LeaseGeneration)
	if row.LeaseExpiresAt != nil {
		claimed := ""
		if row.LastAttemptedAt != nil {
			claimed = ", claimed " + stamp(*row.LastAttemptedAt)
		}
		line("lease", "%q until %s%s", row.LeaseOwner, stamp(*row.LeaseExpiresAt), claimed)
	}
	if row.LastError != "" {
		line("last error", "%s", oneLine(row.LastError, 200))
	}
	if row.FinishedAt != nil {
		line("finished at", "%s", stamp(*row.FinishedAt))
	}
	if row.DeadLetteredAt != nil {
		line("dead-lettered at", "%s", stamp(*row.DeadLetteredAt))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if kind != console.PayloadBinary {
		fmt.Fprintf(w, "\npayload:\n%s\n", indentPayload(payload))
	}
	if len(row.Attempts) == 0 {
		fmt.Fprintln(w, "\nno finished attempts yet")
		return nil
	}
	fmt.Fprintf(w, "\nhistory: %s, oldest first (at most %d are kept)\n",
		plural.Count(len(row.Attempts), "finished attempt", "finished attempts"), leasing.AttemptHistoryLimit)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ATTEMPT\tOUTCOME\tLEASE\tCLAIMED AT\tFINISHED AT\tERROR")
	for _, a := range row.Attempts {
		outcome := string(a.End)
		if a.Operator {
			outcome += " (operator)"
		}
		if a.Forced {
			outcome += " (forced)"
		}
		lease := "-"
		if a.Owner != "" {
			lease = fmt.Sprintf("%s#%d", shown(a.Owner), a.Generation)
		}
		claimed := "-"
		if a.ClaimedAt != nil {
			claimed = stamp(*a.ClaimedAt)
		}
		errText := "-"
		if a.Error != "" {
			errText = oneLine(a.Error, 120)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\n", a.Attempt, outcome, lease, claimed, stamp(a.FinishedAt), errText)
	}
	return tw.Flush()
}

// stamp formats a database time for the text output: UTC, microseconds.
func stamp(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000000Z") }

// shown returns text as it may be printed to a terminal: quoted (Go
// syntax) when it holds a rune that is not printable, such as a line
// break, a tab or an escape sequence's ESC, else unchanged. Message fields
// and error texts come from producers and handlers, not from the operator.
func shown(text string) string {
	for _, r := range text {
		if !unicode.IsPrint(r) {
			return strconv.Quote(text)
		}
	}
	return text
}

// oneLine quotes text as shown does, and cuts it to
// about max bytes, so that one error stays on one line of a table.
func oneLine(text string, max int) string {
	cut := false
	if len(text) > max {
		for max > 0 && !utf8.RuneStart(text[max]) {
			max--
		}
		text, cut = text[:max], true
	}
	text = shown(text)
	if cut {
		text += "…"
	}
	return text
}

// payloadShown is the most payload bytes get prints.
const payloadShown = 64 << 10

// indentPayload returns payload text for the terminal: each line indented
// by two spaces, control characters quoted as shown does, cut after
// payloadShown bytes.
func indentPayload(text string) string {
	more := ""
	if len(text) > payloadShown {
		n := payloadShown
		for n > 0 && !utf8.RuneStart(text[n]) {
			n--
		}
		text, more = text[:n], fmt.Sprintf("\n  … (%d more bytes)", len(text)-n)
	}
	lines := strings.Split(text, "\n")
	for i, l := range lines {
		lines[i] = "  " + shownLine(l)
	}
	return strings.Join(lines, "\n") + more
}

// shownLine is shown for one line of text, tabs kept.
func shownLine(line string) string {
	return shown(strings.ReplaceAll(line, "\t", "    "))
}
