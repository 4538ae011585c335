package doctor

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/leasestore/leasestore/internal/plural"
	"github.com/leasestore/leasestore/leasing"
)

// WriteText writes rep for people: a few lines per queue, and each claim
// plan's tree when rep.ShowPlans.
func WriteText(w io.Writer, rep Report) error {
	var b strings.Builder
	for _, q := range rep.Queues {
		status := "ok"
		if len(q.Problems) > 0 {
			status = plural.Count(len(q.Problems), "problem", "problems")
		}
		fmt.Fprintf(&b, "%s (%s): %s\n", q.Queue, q.Table, status)
		var idx []string
		for _, i := range q.Indexes {
			state := "valid"
			switch {
			case !i.Present:
				state = "MISSING"
			case !i.Valid:
				state = "INVALID"
			}
			idx = append(idx, i.Name+" "+state)
		}
		fmt.Fprintf(&b, "  indexes: %s\n", strings.Join(idx, ", "))
		if len(q.ClaimPlan) > 0 {
			fmt.Fprintf(&b, "  claim of %d: %d rows, %d buffers, %.3f ms; seq scan %t, sort over eligible %t, temp blocks %d; generic plan %d buffers, JIT %t\n",
				q.ClaimBatch, q.ClaimRows, q.ClaimBuffers, q.ClaimMs, q.SeqScan, q.SortOverEligible, q.TempBlocks, q.GenericClaimBuffers, q.JIT)
			if rep.ShowPlans {
				for _, n := range q.ClaimPlan {
					fmt.Fprintf(&b, "    %s\n", n)
				}
			}
			fmt.Fprintf(&b, "  expired leases %d, oldest due %s, overdue %t, dead-lettered %d\n",
				q.ExpiredLeases, round(time.Duration(q.OldestDueSeconds*float64(time.Second))), q.Overdue, q.DeadLettered)
			window := "finished rows kept"
			if q.Queue == string(leasing.Inbox) {
				window = "dedup window (finished rows kept)"
			}
			fmt.Fprintf(&b, "  %s %s, dead letters kept %s\n", window,
				round(time.Duration(q.RetainedSeconds*float64(time.Second))), round(time.Duration(q.RetainedDeadSeconds*float64(time.Second))))
			if h := q.OldestHead; h != nil {
				fmt.Fprintf(&b, "  waiting behind their keys %d; longest-held key %q (tenant %q): head %s for %s\n",
					q.Waiting, h.OrderingKey, h.TenantID, h.MessageID, round(time.Duration(h.AgeSeconds*float64(time.Second))))
			}
		}
		// The tables' state and the signal are read whatever the role may
		// do with the rows, so they are printed even when the checks above
		// were skipped; not for a table that does not exist (its report
		// lists no index).
		for _, p := range q.Paused {
			what := "whole queue"
			if p.Topic != "" {
				what = fmt.Sprintf("topic %q", p.Topic)
			}
			fmt.Fprintf(&b, "  paused: %s by %s at %s\n", what, p.By, p.At.Format(time.RFC3339))
		}
		if len(q.Indexes) > 0 {
			fmt.Fprintf(&b, "  dead tuples %d (live %d), last autovacuum %s, last vacuum %s, this role may vacuum %t\n",
				q.DeadTuples, q.LiveTuples, ago(q.LastAutovacuum), ago(q.LastVacuum), q.MayVacuum)
		}
		if k := q.Keys; k != nil {
			fmt.Fprintf(&b, "  %s: dead tuples %d (live %d), last autovacuum %s, last vacuum %s, this role may vacuum %t\n",
				k.Table, k.DeadTuples, k.LiveTuples, ago(k.LastAutovacuum), ago(k.LastVacuum), k.MayVacuum)
		}
		if sig := q.Signal; sig != nil {
			fmt.Fprintf(&b, "  work signal: sequence %s, read by the insert trigger's WHEN clause %t, this role may read it %t, roles that may insert but not read it %d\n",
				sig.Sequence, sig.Gated, sig.MaySelect, len(sig.RolesWithoutSelect))
		}
		for _, p := range q.Problems {
			fmt.Fprintf(&b, "  problem: %s\n", p)
		}
		for _, p := range q.Warnings {
			fmt.Fprintf(&b, "  warning: %s\n", p)
		}
	}
	applied := 0
	var missing []string
	for _, m := range rep.Migrations {
		if m.Applied {
			applied++
		} else {
			missing = append(missing, m.Name)
		}
	}
	switch {
	case len(rep.Migrations) == 0:
		fmt.Fprintf(&b, "migrations: unknown (the history is not readable)\n")
	case len(missing) == 0:
		fmt.Fprintf(&b, "migrations: all %d applied\n", applied)
	default:
		fmt.Fprintf(&b, "migrations: %d of %d applied; MISSING %s\n", applied, len(rep.Migrations), strings.Join(missing, ", "))
	}
	if rep.OldestXactPID != 0 {
		fmt.Fprintf(&b, "oldest snapshot holding back cleanup: %s (session %d, %s)\n",
			round(time.Duration(rep.OldestXactSeconds*float64(time.Second))), rep.OldestXactPID, rep.OldestXactState)
	} else {
		fmt.Fprintf(&b, "oldest snapshot holding back cleanup: none\n")
	}
	for _, p := range rep.Problems {
		fmt.Fprintf(&b, "problem: %s\n", p)
	}
	for _, p := range rep.Warnings {
		fmt.Fprintf(&b, "warning: %s\n", p)
	}
	if rep.OK {
		fmt.Fprintf(&b, "OK\n")
	} else {
		fmt.Fprintf(&b, "NOT OK\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func utc(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}

// ago says how long ago t was, or "never".
func ago(t *time.Time) string {
	if t == nil {
		return "never"
	}
	return round(time.Since(*t)) + " ago"
}

func round(d time.Duration) string {
	switch {
	case d >= time.Minute:
		return d.Round(time.Second).String()
	case d >= time.Second:
		return d.Round(100 * time.Millisecond).String()
	}
	return d.Round(time.Millisecond).String()
}
