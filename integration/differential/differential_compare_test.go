package differential_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/leasestore/leasestore/leasing"
	"github.com/stretchr/testify/require"
)

// compareAll compares every row of both queues, in (created_at, id) order.
func (r *diffRun) compareAll() {
	r.t.Helper()
	for _, q := range queuesBoth {
		var mrows, prows []string
		for _, row := range r.mem[q].Rows() {
			mrows = append(mrows, normRow(row))
		}
		// List pages in (status, created_at, id) order: sort its rows into
		// Memory's (created_at, id) order.
		var all []leasing.Row
		req := leasing.ListRequest{Limit: 500}
		for {
			page, err := r.pg[q].List(r.ctx, req)
			require.NoError(r.t, err)
			all = append(all, page.Rows...)
			if page.Next.IsZero() {
				break
			}
			req.After = page.Next
		}
		slices.SortFunc(all, func(a, b leasing.Row) int {
			if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
				return c
			}
			return bytes.Compare(a.ID[:], b.ID[:])
		})
		for _, row := range all {
			prows = append(prows, normRow(row))
		}
		r.same(string(q)+" final row count", len(mrows), len(prows))
		for i := range mrows {
			r.same(fmt.Sprintf("%s final row %d", q, i), mrows[i], prows[i])
		}
	}
}

func short(id uuid.UUID) string { return id.String()[:8] }

// errKind names an error for comparison: argument errors by their text,
// sentinels by name, anything else (a driver error) as "other".
func errKind(err error) string {
	var (
		ae       *leasing.ArgumentError
		conflict *leasing.OrderingKeyConflictError
	)
	switch {
	case err == nil:
		return "ok"
	case errors.As(err, &ae):
		return "invalid argument: " + ae.Error()
	case errors.Is(err, leasing.ErrDuplicate):
		return "duplicate"
	case errors.As(err, &conflict):
		return "ordering key conflict: " + conflict.ID.String()
	case errors.Is(err, leasing.ErrNotFound):
		return "not found"
	case errors.Is(err, leasing.ErrLeaseHeld):
		return "lease held: " + err.Error()
	case errors.Is(err, leasing.ErrAlreadyTerminal):
		return "already terminal: " + err.Error()
	}
	return "other: " + err.Error()
}

func normTime(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

func normTimePtr(t *time.Time) string {
	if t == nil {
		return "nil"
	}
	return normTime(*t)
}

// normJSON re-encodes a JSON document (jsonb reorders keys and spaces).
func normJSON(b json.RawMessage) string {
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		return "invalid:" + string(b)
	}
	out, _ := json.Marshal(v)
	return string(out)
}

func normMessage(m leasing.Message) string {
	return fmt.Sprintf("id=%s type=%q payload=%x headers=%s tenant=%q key=%q topic=%q ordering=%q created=%s visible=%s",
		m.ID, m.Type, m.Payload, normJSON(m.Headers), m.TenantID, m.IdempotencyKey, m.Topic, m.OrderingKey,
		normTime(m.CreatedAt), normTime(m.VisibleAfter))
}

func normLeases(ls []leasing.Lease) []string {
	out := make([]string, len(ls))
	for i, l := range ls {
		out[i] = fmt.Sprintf("{%s owner=%q gen=%d expires=%s attempt=%d last_error=%q %s}",
			l.Queue, l.Owner, l.Generation, normTime(l.ExpiresAt), l.Attempt, l.LastError, normMessage(l.Message))
	}
	return out
}

func normRow(r leasing.Row) string {
	return fmt.Sprintf("{%s status=%s seq=%d owner=%q expires=%s gen=%d attempts=%d attempted=%s last_error=%q finished=%s dead=%s history=%s}",
		normMessage(r.Message), r.Status, r.KeySeq, r.LeaseOwner, normTimePtr(r.LeaseExpiresAt), r.LeaseGeneration, r.AttemptCount,
		normTimePtr(r.LastAttemptedAt), r.LastError, normTimePtr(r.FinishedAt), normTimePtr(r.DeadLetteredAt), normAttempts(r.Attempts))
}

// normAttempts prints an attempt history, entry by entry, with UTC times.
func normAttempts(history []leasing.Attempt) string {
	parts := make([]string, len(history))
	for i, a := range history {
		parts[i] = fmt.Sprintf("{#%d gen=%d owner=%q claimed=%s finished=%s %s error=%q operator=%t forced=%t}",
			a.Attempt, a.Generation, a.Owner, normTimePtr(a.ClaimedAt), normTime(a.FinishedAt), a.End, a.Error, a.Operator, a.Forced)
	}
	return "[" + strings.Join(parts, " ") + "]"
}
