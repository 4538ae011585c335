// Command render writes the per-queue query files that sqlc compiles:
// each db/queries/<concern>.sql.tmpl, with the shared fragments of
// db/queries/partials.sql.tmpl, renders db/queries/inbox_<concern>.sql and
// outbox_<concern>.sql, so that gen/inbox_<concern>.sql.go sits beside its
// source by name.
//
// Run it from the module root, before sqlc (make generate does both). With
// -check it writes nothing and fails when a rendered file is missing,
// differs from its template's output or has no template left (make verify).
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/template"
)

// attemptHistoryLimit is how many entries the attempts column keeps. The
// rendered SQL is its source of truth; leasing.AttemptHistoryLimit must
// equal it (leasing's TestAttemptHistoryLimitMatchesSQL).
const attemptHistoryLimit = 20

// concerns are the templates in db/queries, one per concern, each
// rendered once per queue.
var concerns = []string{"claim", "write", "lease", "enqueue", "keys", "operator", "purge", "read", "vacuum"}

const (
	dir      = "db/queries"
	partials = "db/queries/partials.sql.tmpl"
)

// queue is what the templates know of one queue's table: the names and
// the literal status values its statements and partial indexes use.
type queue struct {
	// Name prefixes the queue's query names: InboxClaim, OutboxClaim.
	Name string
	// Noun names the queue in prose and in file names: inbox, outbox.
	Noun string
	// Table is the queue's table; Keys the table of its ordering keys.
	Table, Keys string
	// InFlight is the status of a leased row.
	InFlight string
	// Done is the status of a row whose handling succeeded, and DoneAt the
	// column that records when.
	Done, DoneAt string
	// Complete names the query that writes Done: InboxComplete, OutboxPublish.
	Complete string
	// KeyAndTopic selects idempotency_key and topic, the columns only one
	// table has, as two columns of both row shapes.
	KeyAndTopic string
	// TopicColumn is the column a claim's topics (ClaimRequest.Topics)
	// match: message_type on the inbox, topic on the outbox.
	TopicColumn string
	// Column is the enqueued column only this table has (idempotency_key,
	// topic), and ColumnValue its value from the unnested input i.
	Column, ColumnValue string
	// Inbox is true for the inbox, which deduplicates by idempotency key.
	Inbox bool
	// Tenant is true while the claim block renders the tenant-scoped claim.
	Tenant bool
	// Ordered is true while the enqueue block renders the statement that
	// takes ordering keys.
	Ordered bool
}

var queues = []queue{
	{
		Name: "Inbox", Noun: "inbox", Table: "inbox_messages", Keys: "inbox_ordering_keys",
		InFlight: "processing", Done: "completed", DoneAt: "completed_at", Complete: "InboxComplete",
		KeyAndTopic: "idempotency_key, ''::text AS topic,", Column: "idempotency_key", TopicColumn: "message_type",
		ColumnValue: "nullif(i.idempotency_key, '')", Inbox: true,
	},
	{
		Name: "Outbox", Noun: "outbox", Table: "outbox_messages", Keys: "outbox_ordering_keys",
		InFlight: "publishing", Done: "published", DoneAt: "published_at", Complete: "OutboxPublish",
		KeyAndTopic: "NULL::text AS idempotency_key, topic,", Column: "topic", ColumnValue: "i.topic",
		TopicColumn: "topic",
	},
}

// KeepAttempts returns the SQL expression for the attempts column of row
// alias with room for one more entry: the column itself while it holds
// fewer than attemptHistoryLimit entries, else its last ones (a jsonpath
// slice, which lax mode clamps to the array).
func (q queue) KeepAttempts(alias string) string {
	return fmt.Sprintf("(CASE WHEN jsonb_array_length(%[1]s.attempts) < %[2]d THEN %[1]s.attempts\n"+
		"              ELSE jsonb_path_query_array(%[1]s.attempts, '$[last - %[3]d to last]') END)",
		alias, attemptHistoryLimit, attemptHistoryLimit-2)
}

// WithTenant returns q for the tenant-scoped claim.
func (q queue) WithTenant() queue {
	q.Tenant = true
	return q
}

// WithOrdered returns q for the enqueue that takes ordering keys.
func (q queue) WithOrdered() queue {
	q.Ordered = true
	return q
}

// sqlHeaderEnd follows the header line of a rendered file: sqlc reads the
// comments before a statement as its doc, and skips empty statements.
const sqlHeaderEnd = "-- The empty statement below keeps this header out of the first query's doc.\n;\n"

// output is one rendered file.
type output struct {
	path, tmpl string
	data       queue
}

func outputs() []output {
	var outs []output
	for _, c := range concerns {
		for _, q := range queues {
			outs = append(outs, output{
				path: filepath.Join(dir, q.Noun+"_"+c+".sql"), tmpl: filepath.Join(dir, c+".sql.tmpl"), data: q,
			})
		}
	}
	return outs
}

func main() {
	check := flag.Bool("check", false, "write nothing; fail when a rendered file differs from its template's output")
	flag.Parse()
	if err := run(*check); err != nil {
		fmt.Fprintln(os.Stderr, "render:", err)
		os.Exit(1)
	}
}

func run(check bool) error {
	var stale []string
	outs := outputs()
	for _, o := range outs {
		want, err := render(o)
		if err != nil {
			return err
		}
		have, err := os.ReadFile(o.path)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		switch {
		case bytes.Equal(have, want):
		case check:
			stale = append(stale, o.path)
		default:
			if err := os.WriteFile(o.path, want, 0o644); err != nil {
				return err
			}
		}
	}
	orphans, err := orphaned(outs)
	if err != nil {
		return err
	}
	for _, p := range orphans {
		if check {
			stale = append(stale, p)
		} else if err := os.Remove(p); err != nil {
			return err
		}
	}
	if len(stale) > 0 {
		return fmt.Errorf("%v differ from their templates; run make generate", stale)
	}
	return nil
}

// orphaned returns the rendered files in dir that no template renders.
func orphaned(outs []output) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var paths []string
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		if !strings.HasSuffix(p, ".sql") || !slices.ContainsFunc(queues, func(q queue) bool { return strings.HasPrefix(e.Name(), q.Noun+"_") }) {
			continue
		}
		if !slices.ContainsFunc(outs, func(o output) bool { return o.path == p }) {
			paths = append(paths, p)
		}
	}
	return paths, nil
}

// render returns o's file: the header, then the template's output with its
// leading blank lines removed.
func render(o output) ([]byte, error) {
	t, err := template.New(filepath.Base(o.tmpl)).Option("missingkey=error").ParseFiles(o.tmpl, partials)
	if err != nil {
		return nil, err
	}
	var body bytes.Buffer
	if err := t.ExecuteTemplate(&body, filepath.Base(o.tmpl), o.data); err != nil {
		return nil, err
	}
	out := fmt.Appendf(nil, "-- Code generated by db/render from %s; DO NOT EDIT.\n%s\n", o.tmpl, sqlHeaderEnd)
	return append(out, bytes.TrimLeft(body.Bytes(), "\n")...), nil
}
