// Command render writes the files that are rendered from templates, so
// that each query, and each adapter method over it, is written once for
// both queues:
//
//   - db/queries/queue.sql.tmpl renders db/queries/inbox.sql and
//     db/queries/outbox.sql, which sqlc compiles into gen/;
//   - leasing/sql_queues.go.tmpl renders leasing/sql_queues.go, the inboxSQL
//     and outboxSQL adapters over the generated functions.
//
// Run it from the module root, before sqlc (make generate does both). With
// -check it writes nothing and fails when a rendered file is missing or
// differs from what the templates render (make verify).
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"go/ast"
	"go/format"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"text/template"
)

// queue is what the templates know of one queue's table: the names and
// the literal status values its statements and partial indexes use.
type queue struct {
	// Name prefixes the queue's query names: InboxClaim, OutboxClaim.
	Name string
	// Noun names the queue in prose and in Go identifiers: inbox, outbox.
	Noun string
	// Table is the queue's table.
	Table string
	// Keys is the table of the queue's ordering keys (migration 00010).
	Keys string
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
	// Inbox is true for the inbox, whose rows carry an idempotency key;
	// outbox rows carry a topic instead.
	Inbox bool
	// Tenant is true while the claim block renders the tenant-scoped claim.
	Tenant bool
	// Ordered is true while the enqueue block renders the statement that
	// takes ordering keys.
	Ordered bool
	// AttemptHistory is how many entries the attempts column keeps:
	// leasing.AttemptHistoryLimit, read from leasing/attempt.go.
	AttemptHistory int
}

// KeepAttempts returns the SQL expression for the attempts column of row
// alias with room for one more entry: the column itself while it holds
// fewer than AttemptHistory entries, else its last AttemptHistory-1 (a
// jsonpath slice, which lax mode clamps to the array).
func (q queue) KeepAttempts(alias string) string {
	return fmt.Sprintf("(CASE WHEN jsonb_array_length(%[1]s.attempts) < %[2]d THEN %[1]s.attempts\n"+
		"              ELSE jsonb_path_query_array(%[1]s.attempts, '$[last - %[3]d to last]') END)",
		alias, q.AttemptHistory, q.AttemptHistory-2)
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

// sqlHeaderEnd follows the header line of a rendered SQL file.
const sqlHeaderEnd = "-- The empty statement below keeps this header out of the first query's doc.\n;\n"

var queues = []queue{
	{
		Name: "Inbox", Noun: "inbox", Table: "inbox_messages", Keys: "inbox_ordering_keys",
		InFlight: "processing", Done: "completed", DoneAt: "completed_at", Complete: "InboxComplete",
		KeyAndTopic: "idempotency_key, ''::text AS topic,", Inbox: true,
	},
	{
		Name: "Outbox", Noun: "outbox", Table: "outbox_messages", Keys: "outbox_ordering_keys",
		InFlight: "publishing", Done: "published", DoneAt: "published_at", Complete: "OutboxPublish",
		KeyAndTopic: "NULL::text AS idempotency_key, topic,",
	},
}

// output is one rendered file: the template, the data and the header line.
type output struct {
	path, tmpl string
	data       any
	goSource   bool
}

// attemptHistorySource holds leasing.AttemptHistoryLimit. It is read from
// the source, not imported: leasing does not compile while the files
// rendered here are stale.
const attemptHistorySource = "leasing/attempt.go"

// attemptHistoryLimit returns the value of the constant
// AttemptHistoryLimit declared in attemptHistorySource.
func attemptHistoryLimit() (int, error) {
	file, err := parser.ParseFile(token.NewFileSet(), attemptHistorySource, nil, 0)
	if err != nil {
		return 0, err
	}
	for _, decl := range file.Decls {
		gd, ok := decl.(*ast.GenDecl)
		if !ok || gd.Tok != token.CONST {
			continue
		}
		for _, spec := range gd.Specs {
			vs := spec.(*ast.ValueSpec)
			for i, id := range vs.Names {
				if id.Name != "AttemptHistoryLimit" || i >= len(vs.Values) {
					continue
				}
				lit, ok := vs.Values[i].(*ast.BasicLit)
				if !ok || lit.Kind != token.INT {
					return 0, fmt.Errorf("%s: AttemptHistoryLimit must be an integer literal", attemptHistorySource)
				}
				n, err := strconv.Atoi(lit.Value)
				if err != nil || n < 2 {
					return 0, fmt.Errorf("%s: AttemptHistoryLimit must be at least 2, got %s", attemptHistorySource, lit.Value)
				}
				return n, nil
			}
		}
	}
	return 0, fmt.Errorf("%s: no constant AttemptHistoryLimit", attemptHistorySource)
}

func outputs() ([]output, error) {
	limit, err := attemptHistoryLimit()
	if err != nil {
		return nil, err
	}
	var outs []output
	queues := slices.Clone(queues)
	for i := range queues {
		queues[i].AttemptHistory = limit
	}
	for _, q := range queues {
		outs = append(outs, output{path: filepath.Join("db", "queries", q.Noun+".sql"), tmpl: "db/queries/queue.sql.tmpl", data: q})
	}
	return append(outs, output{path: filepath.Join("leasing", "sql_queues.go"), tmpl: "leasing/sql_queues.go.tmpl", data: queues, goSource: true}), nil
}

func main() {
	check := flag.Bool("check", false, "write nothing; fail when a rendered file differs from its template's output")
	flag.Parse()
	var stale []string
	outs, err := outputs()
	if err != nil {
		fmt.Fprintln(os.Stderr, "render:", err)
		os.Exit(1)
	}
	for _, o := range outs {
		want, err := render(o)
		if err != nil {
			fmt.Fprintln(os.Stderr, "render:", err)
			os.Exit(1)
		}
		have, err := os.ReadFile(o.path)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			fmt.Fprintln(os.Stderr, "render:", err)
			os.Exit(1)
		}
		if bytes.Equal(have, want) {
			continue
		}
		if *check {
			stale = append(stale, o.path)
			continue
		}
		if err := os.WriteFile(o.path, want, 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "render:", err)
			os.Exit(1)
		}
	}
	if len(stale) > 0 {
		fmt.Fprintf(os.Stderr, "render: %v differ from their templates; run make generate\n", stale)
		os.Exit(1)
	}
}

// render returns o's file: the header line, then the template's output with
// its leading blank lines removed (Go source formatted by go/format).
func render(o output) ([]byte, error) {
	t, err := template.New(filepath.Base(o.tmpl)).Option("missingkey=error").ParseFiles(o.tmpl)
	if err != nil {
		return nil, err
	}
	var body bytes.Buffer
	if err := t.Execute(&body, o.data); err != nil {
		return nil, err
	}
	comment := "--"
	if o.goSource {
		comment = "//"
	}
	out := fmt.Appendf(nil, "%s Code generated by db/render from %s; DO NOT EDIT.\n", comment, o.tmpl)
	if !o.goSource {
		// An empty statement ends the header: sqlc reads the comments
		// before a statement as its doc, and skips empty statements.
		out = append(out, sqlHeaderEnd...)
	}
	out = append(out, '\n')
	out = append(out, bytes.TrimLeft(body.Bytes(), "\n")...)
	if !o.goSource {
		return out, nil
	}
	src, err := format.Source(out)
	if err != nil {
		return nil, fmt.Errorf("%s: gofmt: %w", o.path, err)
	}
	return src, nil
}
