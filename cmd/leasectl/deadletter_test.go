package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/internal/dbtest"
	"github.com/leasestore/leasestore/leasing"
)

// oneMessage enqueues one message on q through the library and returns its id.
func oneMessage(t *testing.T, store *leasing.Postgres) uuid.UUID {
	t.Helper()
	msg := leasing.NewMessage{Type: "order.placed"}
	if store.Queue() == leasing.Outbox {
		msg.Topic = "orders"
	}
	res, err := store.Enqueue(t.Context(), msg)
	require.NoError(t, err)
	return res.IDs[0]
}

func claimFor(t *testing.T, store *leasing.Postgres, owner string, leaseFor time.Duration) leasing.Lease {
	t.Helper()
	leases, err := store.Claim(t.Context(), leasing.ClaimRequest{Owner: owner, BatchSize: 1, LeaseFor: leaseFor})
	require.NoError(t, err)
	require.Len(t, leases, 1)
	return leases[0]
}

// TestGetPrintsHistory: get prints the message and its attempt history as
// text and as JSON, on both queues.
func TestGetPrintsHistory(t *testing.T) {
	t.Parallel()
	url := dbtest.DatabaseURL(t)
	for _, q := range []leasing.Queue{leasing.Inbox, leasing.Outbox} {
		store := storeFor(t, url, q)
		id := oneMessage(t, store)
		first := claimFor(t, store, "worker-a", time.Hour)
		res, err := store.Fail(t.Context(), leasing.Failure{Lease: first, Error: "connection refused\nat line 2"})
		require.NoError(t, err)
		require.NoError(t, res.Err())
		second := claimFor(t, store, "worker-b", time.Hour)
		res, err = store.Complete(t.Context(), second)
		require.NoError(t, err)
		require.NoError(t, res.Err())

		out := requireOK(t, "get", "--queue", string(q), "--id", id.String(), "--database-url", url)
		require.Contains(t, out, "status            "+string(q.Succeeded()))
		require.Contains(t, out, "history: 2 finished attempts, oldest first (at most 20 are kept)")
		lines := strings.Split(out, "\n")
		var history []string
		for i, l := range lines {
			if strings.HasPrefix(l, "ATTEMPT") {
				history = lines[i+1 : i+3]
			}
		}
		require.Len(t, history, 2, out)
		require.Regexp(t, fmt.Sprintf(`^1 +failed +worker-a#%d +\S+ +\S+ +"connection refused\\nat line 2"$`, first.Generation), history[0])
		require.Regexp(t, fmt.Sprintf(`^2 +%s +worker-b#%d +\S+ +\S+ +-$`, q.Succeeded(), second.Generation), history[1])

		var got rowJSON
		out = requireOK(t, "get", "--queue", string(q), "--id", id.String(), "--json", "--database-url", url)
		require.NoError(t, json.Unmarshal([]byte(out), &got), out)
		require.Equal(t, id, got.MessageID)
		require.Equal(t, q.Succeeded(), got.Status)
		require.Equal(t, 2, got.AttemptsKept)
		require.Equal(t, leasing.AttemptHistoryLimit, got.AttemptsKeptLimit)
		row, err := store.Get(t.Context(), id)
		require.NoError(t, err)
		require.Equal(t, row.Attempts, got.Attempts)
		require.Equal(t, leasing.AttemptFailed, got.Attempts[0].End)
		require.Equal(t, "connection refused\nat line 2", got.Attempts[0].Error)
		require.Equal(t, "worker-a", got.Attempts[0].Owner)
		require.Equal(t, first.Generation, got.Attempts[0].Generation)
	}

	fresh := oneMessage(t, storeFor(t, url, leasing.Inbox))
	out := requireOK(t, "get", "--queue", "inbox", "--id", fresh.String(), "--database-url", url)
	require.Contains(t, out, "no finished attempts yet")

	r := leasectl(t, "get", "--queue", "inbox", "--id", uuid.NewString(), "--database-url", url)
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "not found")
}

// TestDeadLetterCommand: dead-letter is refused while a live lease holds
// the message, works with --force and fences the holder, works without it
// once the lease expired, refuses finished messages, and records each in
// the history; on both queues.
func TestDeadLetterCommand(t *testing.T) {
	t.Parallel()
	url := dbtest.DatabaseURL(t)
	for _, q := range []leasing.Queue{leasing.Inbox, leasing.Outbox} {
		store := storeFor(t, url, q)
		id := oneMessage(t, store)
		held := claimFor(t, store, "worker-a", time.Hour)
		args := []string{"dead-letter", "--queue", string(q), "--id", id.String(), "--reason", "poison: ticket 42", "--database-url", url}

		r := leasectl(t, args...)
		require.Equal(t, 1, r.code, r.stderr)
		require.Contains(t, r.stderr, `is leased to "worker-a" until`)
		require.Contains(t, r.stderr, "pass --force")
		row, err := store.Get(t.Context(), id)
		require.NoError(t, err)
		require.Equal(t, q.InFlight(), row.Status, "refused: nothing changed")
		require.Empty(t, row.Attempts)

		out := requireOK(t, append(args, "--force")...)
		require.Contains(t, out, "dead-lettered "+string(q)+" message "+id.String()+" after 1 attempt\n")
		require.Contains(t, out, fmt.Sprintf(`fenced the live lease of "worker-a" (generation %d)`, held.Generation))
		res, err := store.Complete(t.Context(), held)
		require.NoError(t, err)
		require.Equal(t, leasing.OutcomeTerminal, res.Outcomes[0].Outcome, "the holder is fenced")
		renew, err := store.Renew(t.Context(), time.Hour, held)
		require.NoError(t, err)
		require.Equal(t, []uuid.UUID{id}, renew.Lost)

		var got rowJSON
		require.NoError(t, json.Unmarshal([]byte(requireOK(t, "get", "--queue", string(q), "--id", id.String(), "--json", "--database-url", url)), &got))
		require.Equal(t, leasing.StatusDeadLettered, got.Status)
		require.Equal(t, "poison: ticket 42", got.LastError)
		require.Equal(t, held.Generation+1, got.LeaseGeneration)
		require.Len(t, got.Attempts, 1)
		entry := got.Attempts[0]
		require.Equal(t, leasing.AttemptDeadLettered, entry.End)
		require.True(t, entry.Operator)
		require.True(t, entry.Forced)
		require.Equal(t, "worker-a", entry.Owner)
		require.Equal(t, held.Generation, entry.Generation)
		require.Equal(t, "poison: ticket 42", entry.Error)
		text := requireOK(t, "get", "--queue", string(q), "--id", id.String(), "--database-url", url)
		require.Regexp(t, fmt.Sprintf(`1 +dead_lettered \(operator\) \(forced\) +worker-a#%d .* poison: ticket 42`, held.Generation), text)
		require.Contains(t, text, "history: 1 finished attempt, oldest first")

		r = leasectl(t, args...)
		require.Equal(t, 1, r.code)
		require.Contains(t, r.stderr, "already terminal")

		// An expired lease needs no --force, and --json prints the entry.
		expired := oneMessage(t, store)
		claimFor(t, store, "worker-b", time.Microsecond) // expired by the time leasectl runs
		var dl deadLetterJSON
		out = requireOK(t, "dead-letter", "--queue", string(q), "--id", expired.String(), "--reason", "by hand", "--json", "--database-url", url)
		require.NoError(t, json.Unmarshal([]byte(out), &dl), out)
		require.Equal(t, expired, dl.MessageID)
		require.Equal(t, "worker-b", dl.Entry.Owner)
		require.True(t, dl.Entry.Operator)
		require.False(t, dl.Entry.Forced)
	}

	r := leasectl(t, "dead-letter", "--queue", "inbox", "--id", uuid.NewString(), "--reason", "x", "--database-url", url)
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "not found")
}

// TestDeadLetterAndGetBadInput: bad input exits 2 without connecting (the
// server does not exist) and, against a real database, changes nothing.
func TestDeadLetterAndGetBadInput(t *testing.T) {
	t.Parallel()
	id := uuid.NewString()
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"dead-letter", "--queue", "inbox", "--id", id}, "--reason must not be blank"},
		{[]string{"dead-letter", "--queue", "inbox", "--id", id, "--reason", "  "}, "--reason must not be blank"},
		{[]string{"dead-letter", "--queue", "inbox", "--id", id, "--reason", "poison \xff"}, "--reason must be UTF-8 without NUL"},
		{[]string{"dead-letter", "--queue", "inbox", "--id", id, "--reason", "\xc3"}, "--reason must be UTF-8 without NUL"},
		{[]string{"dead-letter", "--queue", "inbox", "--reason", "x"}, "--id is required"},
		{[]string{"dead-letter", "--queue", "inbox", "--id", "nope", "--reason", "x"}, "not a UUID"},
		{[]string{"dead-letter", "--queue", "inbox", "--id", id, "--id", id, "--reason", "x"}, "give one --id"},
		{[]string{"dead-letter", "--id", id, "--reason", "x"}, "--queue is required"},
		{[]string{"dead-letter", "--queue", "inbox", "--id", uuid.Nil.String(), "--reason", "x"}, "must not be the nil UUID"},
		{[]string{"get", "--queue", "inbox"}, "--id is required"},
		{[]string{"get", "--queue", "sideways", "--id", id}, "--queue must be inbox or outbox"},
		{[]string{"get", "--queue", "inbox", "--id", id, "extra"}, `unexpected argument "extra"`},
	}
	unreachable := unreachableURL(t)
	url := dbtest.DatabaseURL(t)
	store := storeFor(t, url, leasing.Inbox)
	msg := oneMessage(t, store)
	held := claimFor(t, store, "worker-a", time.Hour)
	before, err := store.Get(t.Context(), msg)
	require.NoError(t, err)
	for _, tc := range cases {
		r := leasectl(t, append(tc.args, "--database-url", unreachable)...)
		require.Equal(t, 2, r.code, "%v: %s", tc.args, r.stderr)
		require.Contains(t, r.stderr, tc.want, tc.args)
		require.Empty(t, r.stdout)
		args := append([]string{}, tc.args...)
		for i := range args {
			if args[i] == id {
				args[i] = msg.String()
			}
		}
		r = leasectl(t, append(args, "--force", "--database-url", url)...)
		require.Equal(t, 2, r.code, "%v: %s", args, r.stderr)
	}
	after, err := store.Get(t.Context(), msg)
	require.NoError(t, err)
	require.Equal(t, before, after)
	res, err := store.Complete(t.Context(), held)
	require.NoError(t, err)
	require.NoError(t, res.Err())
}

// TestGetQuotesControlCharacters: text that producers and handlers wrote
// (a tenant, an error) reaches the terminal quoted when it holds a control
// character, so that an escape sequence in it is shown, not run.
func TestGetQuotesControlCharacters(t *testing.T) {
	t.Parallel()
	url := dbtest.DatabaseURL(t)
	store := storeFor(t, url, leasing.Inbox)
	res, err := store.Enqueue(t.Context(), leasing.NewMessage{Payload: []byte("p"), TenantID: "t\x1b[2J"})
	require.NoError(t, err)
	id := res.IDs[0]
	l, err := store.Claim(t.Context(), leasing.ClaimRequest{Owner: "w\x07", BatchSize: 1, LeaseFor: time.Hour, TenantID: "t\x1b[2J"})
	require.NoError(t, err)
	require.Len(t, l, 1)
	fr, err := store.Fail(t.Context(), leasing.Failure{Lease: l[0], Error: "\x1b[31mred"})
	require.NoError(t, err)
	require.NoError(t, fr.Err())

	out := requireOK(t, "get", "--queue", "inbox", "--id", id.String(), "--database-url", url)
	require.NotContains(t, out, "\x1b", out)
	require.NotContains(t, out, "\x07", out)
	require.Contains(t, out, `"t\x1b[2J"`)
	require.Contains(t, out, `"\x1b[31mred"`)
	require.Contains(t, out, fmt.Sprintf(`"w\a"#%d`, l[0].Generation))
}
