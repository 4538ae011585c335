package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/leasestore/leasestore/internal/plural"
	"github.com/leasestore/leasestore/leasing"
)

// runRequeue is "leasectl requeue".
func runRequeue(ctx context.Context, c *cli, args []string) error {
	fs := c.newFlagSet("requeue", "--queue inbox|outbox (--id ID ... | --all) [--json]\n\n"+
		"Moves dead-lettered messages back to pending, due at once, with the attempt count\n"+
		"0 and lease and last error cleared; the attempt history is kept. Messages in any\n"+
		"other state are left alone: when --id names one, or one the queue does not hold,\n"+
		"requeue says which and exits 1 after requeueing the others.")
	queue := fs.String("queue", "", "queue: inbox or outbox (required)")
	var ids []uuid.UUID
	fs.Func("id", "message `ID` to requeue; repeat for more, up to "+fmt.Sprint(leasing.MaxBatchSize), func(s string) error {
		id, err := parseID(s)
		if err != nil {
			return err
		}
		ids = append(ids, id)
		return nil
	})
	all := fs.Bool("all", false, "requeue every dead-lettered message of the queue")
	asJSON := fs.Bool("json", false, "print the result as JSON, with the requeued ids and, for --id, those left alone (not_requeued)")
	if err := c.parse(fs, args); err != nil {
		return err
	}
	q, err := parseQueue(*queue)
	if err != nil {
		return err
	}
	switch {
	case *all && len(ids) > 0:
		return usagef("--id and --all are mutually exclusive")
	case !*all && len(ids) == 0:
		return usagef("say which messages: --id ID (repeatable) or --all")
	}

	store, err := c.lazyStore(q)
	if err != nil {
		return err
	}
	defer store.Pool().Close()
	var res leasing.RequeueResult
	if *all {
		res, err = store.RequeueAll(ctx)
	} else {
		res, err = store.Requeue(ctx, ids...)
	}
	if err != nil {
		return c.storeError(err)
	}
	left := notRequeued(ids, res.Requeued)
	if *asJSON {
		err = writeJSON(c.stdout, struct {
			Queue       leasing.Queue `json:"queue"`
			Requested   int           `json:"requested"`
			Requeued    int           `json:"requeued"`
			RequeuedIDs []uuid.UUID   `json:"requeued_ids"`
			NotRequeued []uuid.UUID   `json:"not_requeued"`
		}{q, res.Requested, len(res.Requeued), res.Requeued, left})
	} else {
		_, err = fmt.Fprintf(c.stdout, "requested %d, requeued %d\n", res.Requested, len(res.Requeued))
	}
	if err != nil {
		return err
	}
	return leftAlone(ctx, store, left)
}

// leftAloneShown is how many ids left alone a requeue error names.
const leftAloneShown = 10

// leftAlone returns nil when left is empty, else the error of a requeue by
// id that left the messages left alone: exit status 1, like get and
// dead-letter of a message the queue does not hold. Requeue reports only
// the ids it requeued, so the error reads the first leftAloneShown of left
// again to say, for each, whether the queue holds it and in what status
// (which may have changed since the requeue).
func leftAlone(ctx context.Context, store *leasing.Postgres, left []uuid.UUID) error {
	if len(left) == 0 {
		return nil
	}
	why := make([]string, 0, leftAloneShown+1)
read:
	for i, id := range left {
		if i == leftAloneShown {
			why = append(why, fmt.Sprintf("and %d more", len(left)-i))
			break
		}
		row, err := store.Get(ctx, id)
		switch {
		case errors.Is(err, leasing.ErrNotFound):
			why = append(why, fmt.Sprintf("%s message %s not found", store.Queue(), id))
		case err != nil:
			// The connection or the context failed: say so, and do not
			// wait for it again for each id left.
			why = append(why, fmt.Sprintf("%s message %s could not be read (%v)", store.Queue(), id, err))
			if rest := len(left) - i - 1; rest > 0 {
				why = append(why, fmt.Sprintf("%d more not read", rest))
			}
			break read
		default:
			// Read after the requeue: the status may have moved since.
			why = append(why, fmt.Sprintf("%s message %s was not dead-lettered (now %s)", store.Queue(), id, row.Status))
		}
	}
	return fmt.Errorf("only dead-lettered messages are requeued, and these were left alone: %s", strings.Join(why, "; "))
}

// notRequeued returns the ids of asked, in order, that requeued lacks: the
// messages a requeue by id left alone (not dead-lettered, or no such
// message). Never nil, so that JSON shows []; empty for --all.
func notRequeued(asked, requeued []uuid.UUID) []uuid.UUID {
	done := make(map[uuid.UUID]bool, len(requeued))
	for _, id := range requeued {
		done[id] = true
	}
	left := []uuid.UUID{}
	for _, id := range asked {
		if !done[id] {
			left = append(left, id)
		}
	}
	return left
}

// runPurge is "leasectl purge".
func runPurge(ctx context.Context, c *cli, args []string) error {
	fs := c.newFlagSet("purge", "--queue inbox|outbox --older-than D [--batch N] [--include-dead-lettered]\n\n"+
		"Deletes finished messages (completed or published) whose completion or\n"+
		"publication is older than D, one bounded batch per statement so that it never\n"+
		"holds long locks. Pending, in-flight and failed messages are never deleted.")
	queue := fs.String("queue", "", "queue: inbox or outbox (required)")
	olderThan := durationFlag(fs, "older-than", 0, "minimum age of the completion/publication time (required)")
	batch := fs.Int("batch", 1000, fmt.Sprintf("most rows one statement deletes, 1..%d", leasing.MaxBatchSize))
	includeDead := fs.Bool("include-dead-lettered", false, "also delete dead-lettered messages, by dead-letter time")
	deadOlderThan := fs.Duration("dead-lettered-older-than", 0, "apply a retention policy: also delete dead letters older than this, >= --older-than")
	minWindow := fs.Duration("min-dedup-window", 0, "apply a retention policy: refuse an --older-than (the inbox's dedup window) shorter than this")
	if err := c.parse(fs, args); err != nil {
		return err
	}
	q, err := parseQueue(*queue)
	if err != nil {
		return err
	}
	if *deadOlderThan != 0 || *minWindow != 0 {
		return runRetention(ctx, c, q, leasing.RetentionPolicy{
			Finished: *olderThan, DeadLettered: *deadOlderThan, MinDedupWindow: *minWindow, BatchSize: *batch,
		})
	}
	req := leasing.PurgeRequest{OlderThan: *olderThan, BatchSize: *batch, IncludeDeadLettered: *includeDead}

	store, err := c.lazyStore(q)
	if err != nil {
		return err
	}
	defer store.Pool().Close()
	progress := newProgress(c.stderr, fmt.Sprintf("purge %s", q))
	total, batches := 0, 0
	for {
		n, err := store.Purge(ctx, req)
		if err != nil {
			progress.finish()
			if batches == 0 {
				return c.storeError(err)
			}
			return fmt.Errorf("after deleting %s: %w", plural.Count(total, "message", "messages"), c.storeError(err))
		}
		total += n
		batches++
		progress.update(total, batches)
		if n < req.BatchSize {
			break
		}
	}
	progress.finish()
	kinds := "finished"
	if *includeDead {
		kinds = "finished and dead-lettered"
	}
	noun := fmt.Sprintf("%s %s message", kinds, q)
	fmt.Fprintf(c.stdout, "purged %s older than %s\n", plural.Count(total, noun, noun+"s"), *olderThan)
	return nil
}

// runRetention is "leasectl purge" with a retention policy: PurgeRetention
// until a call deletes less than a batch of each kind, in the queue's
// retention turn (one runner at a time with processors applying one).
func runRetention(ctx context.Context, c *cli, q leasing.Queue, p leasing.RetentionPolicy) error {
	p, err := p.Resolve()
	if err != nil {
		return err
	}
	store, err := c.lazyStore(q)
	if err != nil {
		return err
	}
	defer store.Pool().Close()
	var total leasing.RetentionResult
	for {
		res, err := store.PurgeRetention(ctx, p)
		total.Finished += res.Finished
		total.DeadLettered += res.DeadLettered
		if err != nil {
			return fmt.Errorf("after deleting %s: %w", plural.Count(total.Finished+total.DeadLettered, "message", "messages"), c.storeError(err))
		}
		if res.Finished < p.BatchSize && res.DeadLettered < p.BatchSize {
			break
		}
	}
	fmt.Fprintf(c.stdout, "purged %d finished %s messages older than %s", total.Finished, q, p.Finished)
	if p.DeadLettered > 0 {
		fmt.Fprintf(c.stdout, " and %d dead-lettered (or finished) older than %s", total.DeadLettered, p.DeadLettered)
	}
	fmt.Fprintln(c.stdout)
	return nil
}

// progress reports a long loop's progress on w: on a terminal one line
// rewritten in place after every batch, otherwise one line per
// progressEvery batches.
type progress struct {
	w        io.Writer
	label    string
	terminal bool
	shown    bool
	last     time.Time
}

// progressEvery is how many batches pass between progress lines when the
// output is not a terminal.
const progressEvery = 10

func newProgress(w io.Writer, label string) *progress {
	return &progress{w: w, label: label, terminal: isTerminal(w)}
}

func (p *progress) update(deleted, batches int) {
	if p.terminal {
		// Redraw at most 20 times a second; the final count comes from finish.
		if now := time.Now(); now.Sub(p.last) >= 50*time.Millisecond {
			p.last = now
			fmt.Fprintf(p.w, "\r%s: %d deleted in %s", p.label, deleted, plural.Count(batches, "batch", "batches"))
			p.shown = true
		}
		return
	}
	if batches%progressEvery == 0 {
		fmt.Fprintf(p.w, "%s: %d deleted in %s\n", p.label, deleted, plural.Count(batches, "batch", "batches"))
	}
}

// finish ends the in-place line on a terminal.
func (p *progress) finish() {
	if p.terminal && p.shown {
		fmt.Fprint(p.w, "\r\033[K")
	}
}

// isTerminal reports whether w is a character device such as a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
