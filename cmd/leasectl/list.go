package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/leasestore/leasestore/console"
	"github.com/leasestore/leasestore/internal/plural"
	"github.com/leasestore/leasestore/leasing"
)

// durationFlag registers a duration flag on fs that parseDuration reads.
func durationFlag(fs *flag.FlagSet, name string, value time.Duration, usage string) *time.Duration {
	d := new(time.Duration)
	*d = value
	fs.Func(name, usage+" ("+console.DurationForm+")", func(s string) error {
		v, err := console.ParseDuration(s)
		if err != nil {
			return err
		}
		*d = v
		return nil
	})
	return d
}

// filterFlags are the flags of a leasing.ListFilter, shared by list and
// bulk.
type filterFlags struct {
	status, typ, tenant, orderingKey, idempotencyKey, topic, errorText *string
	olderThan                                                          *time.Duration
}

func addFilterFlags(fs *flag.FlagSet) filterFlags {
	return filterFlags{
		status:         fs.String("status", "", "only messages in this `status` (e.g. pending, failed, dead_lettered)"),
		typ:            fs.String("type", "", "only messages of this `type`"),
		tenant:         fs.String("tenant", "", "only this tenant's messages"),
		orderingKey:    fs.String("ordering-key", "", "only messages of this ordering key"),
		idempotencyKey: fs.String("idempotency-key", "", "only the inbox message of this idempotency key (inbox only)"),
		topic:          fs.String("topic", "", "only messages of this topic (outbox only)"),
		errorText:      fs.String("error", "", "only messages whose last error contains this `text` (case-sensitive)"),
		olderThan:      durationFlag(fs, "older-than", 0, "only messages created at least this long ago"),
	}
}

// filter returns the flags' filter for queue q; a bad status is a usage
// error, the library checks the rest.
func (f filterFlags) filter(q leasing.Queue) (leasing.ListFilter, error) {
	lf := leasing.ListFilter{
		Type: *f.typ, TenantID: *f.tenant, OrderingKey: *f.orderingKey, IdempotencyKey: *f.idempotencyKey,
		Topic: *f.topic, ErrorContains: *f.errorText, OlderThan: *f.olderThan,
	}
	if *f.status != "" {
		st, err := q.ParseStatus(*f.status)
		if err != nil {
			return lf, usagef("--status %q is not a status of the %s queue: %s", *f.status, q, statusNames(q))
		}
		lf.Status = st
	}
	return lf, nil
}

// statusNames lists q's statuses for error messages.
func statusNames(q leasing.Queue) string {
	names := make([]string, 0, 6)
	for _, s := range q.Statuses() {
		names = append(names, string(s))
	}
	return strings.Join(names, ", ")
}

func init() {
	for k, v := range map[string]string{
		"status": "--status", "error text": "--error", "idempotency key": "--idempotency-key",
		"list limit": "--limit", "cursor": "--after", "bulk batch": "--batch",
	} {
		argumentFlags[k] = v
	}
}

// listJSON is list --json's output.
type listJSON struct {
	Queue    leasing.Queue `json:"queue"`
	Messages []rowJSON     `json:"messages"`
	// Next is the --after of the next page; "" after the last page.
	Next string `json:"next"`
}

// runList is "leasectl list".
func runList(ctx context.Context, c *cli, args []string) error {
	fs := c.newFlagSet("list", "--queue inbox|outbox [filters] [--limit N] [--after CURSOR] [--json]\n\n"+
		"Lists the messages that match every filter given, in (status, created at, id)\n"+
		"order, one page at a time: a page costs its rows at any table size. The last\n"+
		"line names the --after of the next page. Times are the database clock, UTC.")
	queue := fs.String("queue", "", "queue: inbox or outbox (required)")
	filters := addFilterFlags(fs)
	limit := fs.Int("limit", 50, fmt.Sprintf("most messages on the page, 1..%d", leasing.MaxBatchSize))
	after := fs.String("after", "", "start after this `cursor` (the previous page's next)")
	asJSON := fs.Bool("json", false, "print the page as JSON, payloads included")
	if err := c.parse(fs, args); err != nil {
		return err
	}
	q, err := parseQueue(*queue)
	if err != nil {
		return err
	}
	f, err := filters.filter(q)
	if err != nil {
		return err
	}
	cursor, err := leasing.ParseCursor(*after)
	if err != nil {
		return flagError(err)
	}

	store, err := c.lazyStore(q)
	if err != nil {
		return err
	}
	defer store.Pool().Close()
	page, err := store.List(ctx, leasing.ListRequest{Filter: f, After: cursor, Limit: *limit})
	if err != nil {
		return c.storeError(err)
	}
	if *asJSON {
		out := listJSON{Queue: q, Messages: make([]rowJSON, len(page.Rows)), Next: page.Next.String()}
		for i, r := range page.Rows {
			out.Messages[i] = rowJSONOf(q, r)
		}
		return writeJSON(c.stdout, out)
	}
	if len(page.Rows) == 0 {
		fmt.Fprintf(c.stdout, "no %s messages match\n", q)
		return nil
	}
	tw := tabwriter.NewWriter(c.stdout, 0, 0, 2, ' ', 0)
	outbox := q == leasing.Outbox // the outbox's rows have a topic, the inbox's do not
	fmt.Fprint(tw, "MESSAGE ID\tSTATUS\t")
	if outbox {
		fmt.Fprint(tw, "TOPIC\t")
	}
	fmt.Fprintln(tw, "TYPE\tCREATED AT\tATTEMPTS\tLAST ERROR")
	for _, r := range page.Rows {
		errText := "-"
		if r.LastError != "" {
			errText = oneLine(r.LastError, 80)
		}
		fmt.Fprintf(tw, "%s\t%s\t", r.ID, r.Status)
		if outbox {
			fmt.Fprintf(tw, "%s\t", oneLine(r.Topic, 40))
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\n", oneLine(r.Type, 40), stamp(r.CreatedAt), r.AttemptCount, errText)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if !page.Next.IsZero() {
		fmt.Fprintf(c.stdout, "more: add --after %s\n", page.Next)
	}
	return nil
}

// runBulk is "leasectl bulk".
func runBulk(ctx context.Context, c *cli, args []string) error {
	fs := c.newFlagSet("bulk", "requeue|dead-letter|purge --queue inbox|outbox [filters] [--dry-run] [--yes] [flags]\n\n"+
		"Acts on every message that matches the filters, one bounded batch per\n"+
		"transaction, with progress on stderr: requeue moves dead letters back to\n"+
		"pending; dead-letter dead-letters unfinished messages as dead-letter --id does\n"+
		"(fenced; --force cuts live leases and the history records it); purge deletes\n"+
		"the messages that are not in flight. It counts the matches first and asks for\n"+
		"confirmation on stdin unless --yes; --dry-run only counts.")
	queue := fs.String("queue", "", "queue: inbox or outbox (required)")
	filters := addFilterFlags(fs)
	reason := fs.String("reason", "", "dead-letter: the last error to record (required)")
	force := fs.Bool("force", false, "dead-letter: also cut live leases (recorded as forced)")
	batch := fs.Int("batch", 500, fmt.Sprintf("most messages one transaction acts on, 1..%d", leasing.MaxBatchSize))
	dryRun := fs.Bool("dry-run", false, "count the matching messages and change nothing")
	yes := fs.Bool("yes", false, "do not ask for confirmation")
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		if err := c.parse(fs, args); err != nil {
			return err
		}
		return usagef("say what to do: leasectl bulk requeue|dead-letter|purge --queue Q [filters]")
	}
	action, err := leasing.ParseBulkAction(args[0])
	if err != nil {
		return usagef("%q is not an action: requeue, dead-letter or purge", args[0])
	}
	if err := c.parse(fs, args[1:]); err != nil {
		return err
	}
	q, err := parseQueue(*queue)
	if err != nil {
		return err
	}
	f, err := filters.filter(q)
	if err != nil {
		return err
	}
	req := leasing.BulkRequest{Action: action, Filter: f, Reason: *reason, Force: *force, BatchSize: *batch}
	if action != leasing.BulkDeadLetter && (*reason != "" || *force) {
		return usagef("--reason and --force are for dead-letter only")
	}

	store, err := c.lazyStore(q)
	if err != nil {
		return err
	}
	defer store.Pool().Close()
	n, err := store.BulkCount(ctx, req)
	if err != nil {
		return c.storeError(err)
	}
	noun := plural.Count(int(n), string(q)+" message", string(q)+" messages")
	if *dryRun {
		fmt.Fprintf(c.stdout, "%s matched: %s would act on each (dry run, nothing changed)\n", noun, action)
		return nil
	}
	if n == 0 {
		fmt.Fprintf(c.stdout, "no %s messages match: nothing to %s\n", q, action)
		return nil
	}
	if !*yes {
		fmt.Fprintf(c.stderr, "%s %s? [y/N] ", action, noun)
		answer, _ := bufio.NewReader(c.stdin).ReadString('\n')
		if a := strings.ToLower(strings.TrimSpace(answer)); a != "y" && a != "yes" {
			fmt.Fprintln(c.stderr, "aborted: nothing changed")
			return exitCode(1)
		}
	}
	progress := newProgress(c.stderr, fmt.Sprintf("%s %s", action, q))
	req.Progress = func(r leasing.BulkResult) { progress.update(r.Applied, r.Batches) }
	res, err := store.Bulk(ctx, req)
	progress.finish()
	if err != nil {
		return c.storeError(err)
	}
	fmt.Fprintf(c.stdout, "%s: %d of %s matched, %d left alone (in flight, leased or changed meanwhile), %s\n",
		action, res.Applied, plural.Count(res.Matched, string(q)+" message", string(q)+" messages"), res.Skipped,
		plural.Count(res.Batches, "batch", "batches"))
	return nil
}

// rowJSONOf is row as get --json and list --json print it.
func rowJSONOf(q leasing.Queue, row leasing.Row) rowJSON {
	out := rowJSON{
		Queue: q, MessageID: row.ID, Type: row.Type, TenantID: row.TenantID, IdempotencyKey: row.IdempotencyKey,
		Topic: row.Topic, OrderingKey: row.OrderingKey, KeySeq: row.KeySeq, Headers: row.Headers, Payload: row.Payload, CreatedAt: row.CreatedAt,
		VisibleAfter: row.VisibleAfter, Status: row.Status, LeaseOwner: row.LeaseOwner,
		LeaseExpiresAt: row.LeaseExpiresAt, LeaseGeneration: row.LeaseGeneration, AttemptCount: row.AttemptCount,
		LastAttemptedAt: row.LastAttemptedAt, LastError: row.LastError, FinishedAt: row.FinishedAt,
		DeadLetteredAt: row.DeadLetteredAt, AttemptsKept: len(row.Attempts),
		AttemptsKeptLimit: leasing.AttemptHistoryLimit, Attempts: row.Attempts,
	}
	switch kind, text := console.FormatPayload(row.Payload); kind {
	case console.PayloadJSON:
		out.PayloadJSON = row.Payload
	case console.PayloadText:
		out.PayloadText = &text
	}
	return out
}
