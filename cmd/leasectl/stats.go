package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasestore/leasestore/leasing"
)

// statsJSON is one queue's entry in stats --json.
type statsJSON struct {
	Depth               map[leasing.Status]int64 `json:"depth"`
	ExpiredLeases       int64                    `json:"expired_leases"`
	OldestDueAgeSeconds float64                  `json:"oldest_due_age_seconds"`
	// OldestHead is the ordering key whose head has held it longest while
	// messages wait behind it; absent when none waits.
	OldestHead *headJSON `json:"oldest_head,omitempty"`
	// Paused lists the pauses in place (leasectl pause): topic "" is the
	// whole queue. Absent on a schema before migration 00015.
	Paused []pauseJSON `json:"paused,omitempty"`
}

// pauseJSON is one pause in stats --json.
type pauseJSON struct {
	Topic string    `json:"topic"`
	By    string    `json:"by"`
	At    time.Time `json:"at"`
}

// headJSON is a key's head in stats --json and doctor --json.
type headJSON struct {
	TenantID    string  `json:"tenant_id,omitempty"`
	OrderingKey string  `json:"ordering_key"`
	MessageID   string  `json:"message_id"`
	AgeSeconds  float64 `json:"age_seconds"`
}

// headOf returns h for JSON, or nil.
func headOf(h *leasing.WaitingHead) *headJSON {
	if h == nil {
		return nil
	}
	return &headJSON{TenantID: h.TenantID, OrderingKey: h.OrderingKey, MessageID: h.MessageID.String(), AgeSeconds: h.Age.Seconds()}
}

// runStats is "leasectl stats".
func runStats(ctx context.Context, c *cli, args []string) error {
	fs := c.newFlagSet("stats", "[--queue inbox|outbox] [--json]")
	queue := fs.String("queue", "", "only this queue: inbox or outbox (default both)")
	asJSON := fs.Bool("json", false, `print {"<queue>": {"depth": {...}, "expired_leases": N, "oldest_due_age_seconds": S, "oldest_head": {...}}}`)
	if err := c.parse(fs, args); err != nil {
		return err
	}
	queues, err := parseQueues(*queue)
	if err != nil {
		return err
	}

	pool, err := c.connect(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	all, err := queueStats(ctx, pool, queues)
	if err != nil {
		return err
	}
	paused, err := queuePauses(ctx, pool, queues)
	if err != nil {
		return err
	}
	if *asJSON {
		out := make(map[leasing.Queue]statsJSON, len(all))
		for _, st := range all {
			js := statsJSON{st.Depth, st.ExpiredLeases, st.OldestDueAge.Seconds(), headOf(st.WaitingHead), nil}
			for _, p := range paused[st.Queue] {
				js.Paused = append(js.Paused, pauseJSON{p.Topic, p.By, p.At})
			}
			out[st.Queue] = js
		}
		return writeJSON(c.stdout, out)
	}
	return printStats(c.stdout, all, paused)
}

// queuePauses returns each queue's pauses in place; none for a schema
// before migration 00015, as Stats runs on an older schema.
func queuePauses(ctx context.Context, pool *pgxpool.Pool, queues []leasing.Queue) (map[leasing.Queue][]leasing.Pause, error) {
	out := map[leasing.Queue][]leasing.Pause{}
	for _, q := range queues {
		store, err := newStore(pool, q)
		if err != nil {
			return nil, err
		}
		p, err := store.Paused(ctx)
		if errors.Is(err, leasing.ErrSchema) {
			continue
		}
		if err != nil {
			return nil, schemaHint(err, describe(pool.Config().ConnConfig))
		}
		out[q] = p
	}
	return out, nil
}

// queueStats returns the Stats of each queue, in order.
func queueStats(ctx context.Context, pool *pgxpool.Pool, queues []leasing.Queue) ([]leasing.Stats, error) {
	all := make([]leasing.Stats, 0, len(queues))
	for _, q := range queues {
		store, err := newStore(pool, q)
		if err != nil {
			return nil, err
		}
		st, err := store.Stats(ctx)
		if err != nil {
			return nil, schemaHint(err, describe(pool.Config().ConnConfig))
		}
		all = append(all, st)
	}
	return all, nil
}

// printStats writes each queue's depth by status (all six, in lifecycle
// order), expired leases, oldest due age and the oldest key head that
// messages wait behind.
func printStats(w io.Writer, all []leasing.Stats, paused map[leasing.Queue][]leasing.Pause) error {
	for _, st := range all {
		if _, err := fmt.Fprintln(w, st.Queue); err != nil {
			return err
		}
		for _, s := range st.Queue.Statuses() {
			fmt.Fprintf(w, "  %-15s %10d\n", s, st.Depth[s])
		}
		fmt.Fprintf(w, "  %-15s %10d\n", "expired leases", st.ExpiredLeases)
		fmt.Fprintf(w, "  %-15s %10s\n", "oldest due age", st.OldestDueAge.Round(time.Millisecond))
		fmt.Fprintf(w, "  %-15s %10s", "oldest key head", st.OldestHeadAge().Round(time.Millisecond))
		if h := st.WaitingHead; h != nil {
			fmt.Fprintf(w, "  key %q", h.OrderingKey)
			if h.TenantID != "" {
				fmt.Fprintf(w, " tenant %q", h.TenantID)
			}
			fmt.Fprintf(w, ", head %s", h.MessageID)
		}
		fmt.Fprintln(w)
		for _, p := range paused[st.Queue] {
			what := "topic " + p.Topic
			if p.Topic == "" {
				what = "whole queue"
			}
			fmt.Fprintf(w, "  %-15s %s by %s at %s\n", "paused", what, p.By, p.At.Format("2006-01-02 15:04:05Z07:00"))
		}
	}
	return nil
}
