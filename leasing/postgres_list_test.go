package leasing_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/leasing"
)

// listAll pages through f with pages of size n and returns the rows.
func listAll(t *testing.T, s *leasing.Postgres, f leasing.ListFilter, n int) []leasing.Row {
	t.Helper()
	var rows []leasing.Row
	req := leasing.ListRequest{Filter: f, Limit: n}
	for {
		page, err := s.List(t.Context(), req)
		require.NoError(t, err)
		require.NotNil(t, page.Rows)
		rows = append(rows, page.Rows...)
		if page.Next.IsZero() {
			return rows
		}
		// The cursor survives its text form.
		next, err := leasing.ParseCursor(page.Next.String())
		require.NoError(t, err)
		require.Equal(t, page.Next, next)
		req.After = next
	}
}

func rowIDs(rows []leasing.Row) []uuid.UUID {
	out := make([]uuid.UUID, len(rows))
	for i, r := range rows {
		out[i] = r.ID
	}
	return out
}

// listFixture enqueues, on s's queue: 3 "a" messages of tenant t1, 2 "b"
// messages, one keyed "k" pair of type "kd", and dead-letters the second
// "a" with "boom: disk full".
type listFixture struct {
	a, b, keyed []uuid.UUID
	dead        uuid.UUID
}

func newListFixture(t *testing.T, s *leasing.Postgres) listFixture {
	t.Helper()
	ctx := t.Context()
	msg := func(typ, tenant, key, extra string) leasing.NewMessage {
		m := leasing.NewMessage{Type: typ, TenantID: tenant, OrderingKey: key, Payload: []byte(`{"n":1}`)}
		if s.Queue() == leasing.Outbox {
			m.Topic = "topic-" + typ
		} else if extra != "" {
			m.IdempotencyKey = extra
		}
		return m
	}
	var f listFixture
	res, err := s.Enqueue(ctx, msg("a", "t1", "", "i1"), msg("a", "t1", "", "i2"), msg("a", "t1", "", "i3"))
	require.NoError(t, err)
	f.a = res.IDs
	res, err = s.Enqueue(ctx, msg("b", "", "", ""), msg("b", "", "", ""))
	require.NoError(t, err)
	f.b = res.IDs
	res, err = s.Enqueue(ctx, msg("kd", "", "k", ""), msg("kd", "", "k", ""))
	require.NoError(t, err)
	f.keyed = res.IDs
	f.dead = f.a[1]
	_, err = s.DeadLetterByID(ctx, leasing.DeadLetterByIDRequest{ID: f.dead, Reason: "boom: disk full"})
	require.NoError(t, err)
	return f
}

func TestListFiltersAndPages(t *testing.T) {
	t.Parallel()
	url := freshURL(t)
	for _, q := range queuesBoth {
		t.Run(string(q), func(t *testing.T) {
			s := openStore(t, url, q, leasing.PostgresOptions{})
			f := newListFixture(t, s)
			all := listAll(t, s, leasing.ListFilter{}, 2)
			require.Len(t, all, 7)
			for i := 1; i < len(all); i++ { // (status, created_at, id) order
				a, b := all[i-1], all[i]
				require.True(t, a.Status < b.Status || a.Status == b.Status && !b.CreatedAt.Before(a.CreatedAt), "%v then %v", a, b)
			}
			require.Equal(t, leasing.StatusDeadLettered, all[0].Status)
			require.Equal(t, leasing.StatusWaiting, all[6].Status)

			cases := []struct {
				name string
				f    leasing.ListFilter
				want []uuid.UUID
			}{
				{"status", leasing.ListFilter{Status: leasing.StatusDeadLettered}, []uuid.UUID{f.dead}},
				{"type", leasing.ListFilter{Type: "b"}, f.b},
				{"tenant", leasing.ListFilter{TenantID: "t1", Status: leasing.StatusPending}, []uuid.UUID{f.a[0], f.a[2]}},
				{"ordering key", leasing.ListFilter{OrderingKey: "k"}, f.keyed},
				{"waiting", leasing.ListFilter{Status: leasing.StatusWaiting}, f.keyed[1:]},
				{"error text", leasing.ListFilter{ErrorContains: "disk"}, []uuid.UUID{f.dead}},
				{"error text is case-sensitive", leasing.ListFilter{ErrorContains: "DISK"}, nil},
				{"older than an hour", leasing.ListFilter{OlderThan: time.Hour}, nil},
				{"no match", leasing.ListFilter{Type: "a", TenantID: "other"}, nil},
			}
			if q == leasing.Inbox {
				cases = append(cases, struct {
					name string
					f    leasing.ListFilter
					want []uuid.UUID
				}{"idempotency key", leasing.ListFilter{IdempotencyKey: "i3"}, []uuid.UUID{f.a[2]}})
			} else {
				cases = append(cases, struct {
					name string
					f    leasing.ListFilter
					want []uuid.UUID
				}{"topic", leasing.ListFilter{Topic: "topic-b"}, f.b})
			}
			for _, c := range cases {
				got := listAll(t, s, c.f, 1)
				if c.want == nil {
					require.Empty(t, got, c.name)
				} else {
					require.ElementsMatch(t, c.want, rowIDs(got), c.name)
				}
				n, err := s.CountMatching(t.Context(), c.f)
				require.NoError(t, err)
				require.EqualValues(t, len(c.want), n, c.name)
			}

			lines, err := s.KeyLines(t.Context(), 10)
			require.NoError(t, err)
			require.Len(t, lines, 1)
			require.Equal(t, "k", lines[0].OrderingKey)
			require.Equal(t, f.keyed[0], lines[0].HeadID)
			require.EqualValues(t, 1, lines[0].Waiting)
			require.NotNil(t, lines[0].HeadSince)

			groups, err := s.DeadLetterGroups(t.Context(), 10)
			require.NoError(t, err)
			require.Len(t, groups, 1)
			require.Equal(t, "boom: disk full", groups[0].LastError)
			require.EqualValues(t, 1, groups[0].Messages)
			require.Equal(t, groups[0].FirstAt, groups[0].LastAt)
		})
	}
}

func TestBulkByFilter(t *testing.T) {
	t.Parallel()
	url := freshURL(t)
	for _, q := range queuesBoth {
		t.Run(string(q), func(t *testing.T) {
			ctx := t.Context()
			s := openStore(t, url, q, leasing.PostgresOptions{})
			f := newListFixture(t, s)
			var progress []leasing.BulkResult
			record := func(r leasing.BulkResult) { progress = append(progress, r) }

			// Requeue by error text: the dead letter comes back.
			req := leasing.BulkRequest{Action: leasing.BulkRequeue, Filter: leasing.ListFilter{ErrorContains: "disk"}, BatchSize: 1, Progress: record}
			n, err := s.BulkCount(ctx, req)
			require.NoError(t, err)
			require.EqualValues(t, 1, n)
			res, err := s.Bulk(ctx, req)
			require.NoError(t, err)
			require.Equal(t, leasing.BulkResult{Matched: 1, Applied: 1, Batches: 1}, res)
			require.Equal(t, []leasing.BulkResult{res}, progress)
			row, err := s.Get(ctx, f.dead)
			require.NoError(t, err)
			require.Equal(t, leasing.StatusPending, row.Status)

			// Dead-letter type "a" while one is leased: skipped, then forced.
			leases, err := s.Claim(ctx, leasing.ClaimRequest{Owner: "w", BatchSize: 1, LeaseFor: time.Hour})
			require.NoError(t, err)
			require.Len(t, leases, 1)
			require.Equal(t, f.a[0], leases[0].Message.ID)
			dl := leasing.BulkRequest{Action: leasing.BulkDeadLetter, Filter: leasing.ListFilter{Type: "a"}, Reason: "misrouted", BatchSize: 2}
			res, err = s.Bulk(ctx, dl)
			require.NoError(t, err)
			require.Equal(t, leasing.BulkResult{Matched: 3, Applied: 2, Skipped: 1, Batches: 2}, res)
			row, err = s.Get(ctx, f.a[0])
			require.NoError(t, err)
			require.Equal(t, q.InFlight(), row.Status)
			dl.Force = true
			res, err = s.Bulk(ctx, dl)
			require.NoError(t, err)
			require.Equal(t, leasing.BulkResult{Matched: 1, Applied: 1, Batches: 1}, res)
			row, err = s.Get(ctx, f.a[0])
			require.NoError(t, err)
			require.Equal(t, leasing.StatusDeadLettered, row.Status)
			last := row.Attempts[len(row.Attempts)-1]
			require.True(t, last.Operator && last.Forced, "%+v", last)
			// The cut lease is fenced.
			wr, err := s.Complete(ctx, leases[0])
			require.NoError(t, err)
			require.Error(t, wr.Err())

			// Purge the key's head: the next message of the key is promoted.
			res, err = s.Bulk(ctx, leasing.BulkRequest{Action: leasing.BulkPurge,
				Filter: leasing.ListFilter{OrderingKey: "k", Status: leasing.StatusPending}, BatchSize: 10})
			require.NoError(t, err)
			require.Equal(t, 1, res.Applied)
			_, err = s.Get(ctx, f.keyed[0])
			require.ErrorIs(t, err, leasing.ErrNotFound)
			row, err = s.Get(ctx, f.keyed[1])
			require.NoError(t, err)
			require.Equal(t, leasing.StatusPending, row.Status)

			// Purge every status but in flight: everything goes.
			_, err = s.Claim(ctx, leasing.ClaimRequest{Owner: "w", BatchSize: 1, LeaseFor: time.Hour})
			require.NoError(t, err)
			res, err = s.Bulk(ctx, leasing.BulkRequest{Action: leasing.BulkPurge, BatchSize: 2})
			require.NoError(t, err)
			require.Equal(t, 5, res.Applied, "%+v", res)
			left := listAll(t, s, leasing.ListFilter{}, 10)
			require.Len(t, left, 1)
			require.Equal(t, q.InFlight(), left[0].Status)
		})
	}
}

// TestBulkBadInputChangesNothing: a refused bulk action leaves every row.
func TestBulkBadInputChangesNothing(t *testing.T) {
	t.Parallel()
	url := freshURL(t)
	s := openStore(t, url, leasing.Inbox, leasing.PostgresOptions{})
	newListFixture(t, s)
	before := tableDigest(t, s.Pool())
	for name, r := range map[string]leasing.BulkRequest{
		"requeue pending": {Action: leasing.BulkRequeue, Filter: leasing.ListFilter{Status: leasing.StatusPending}, BatchSize: 1},
		"topic on inbox":  {Action: leasing.BulkPurge, Filter: leasing.ListFilter{Topic: "x"}, BatchSize: 1},
		"blank reason":    {Action: leasing.BulkDeadLetter, Reason: " ", BatchSize: 1},
		"huge batch":      {Action: leasing.BulkPurge, BatchSize: leasing.MaxBatchSize + 1},
	} {
		_, err := s.Bulk(context.Background(), r)
		require.True(t, isArgErr(err), "%s: %v", name, err)
	}
	require.Equal(t, before, tableDigest(t, s.Pool()))
}
