package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/internal/dbtest"
	"github.com/leasestore/leasestore/leasing"
)

// listFixture enqueues 3 inbox messages of type "a" and dead-letters the
// second, and returns their ids.
func listFixture(t *testing.T, store *leasing.Postgres) []uuid.UUID {
	t.Helper()
	res, err := store.Enqueue(t.Context(),
		leasing.NewMessage{Type: "a", Payload: []byte(`{"order":7,"items":[1,2]}`)},
		leasing.NewMessage{Type: "a", Payload: []byte("<script>alert(1)</script>")},
		leasing.NewMessage{Type: "a", Payload: []byte{0xff, 0x00, 0x01}})
	require.NoError(t, err)
	_, err = store.DeadLetterByID(t.Context(), leasing.DeadLetterByIDRequest{ID: res.IDs[1], Reason: "boom: bad address"})
	require.NoError(t, err)
	return res.IDs
}

func TestListCommand(t *testing.T) {
	t.Parallel()
	url := dbtest.DatabaseURL(t)
	ids := listFixture(t, storeFor(t, url, leasing.Inbox))

	out := requireOK(t, "list", "--queue", "inbox", "--status", "dead_lettered", "--database-url", url)
	require.Contains(t, out, ids[1].String())
	require.Contains(t, out, "boom: bad address")
	require.NotContains(t, out, ids[0].String())
	require.NotContains(t, out, "more:")

	// Pages of one: the last line names the next page's cursor.
	var seen []string
	args := []string{"list", "--queue", "inbox", "--type", "a", "--limit", "1", "--json", "--database-url", url}
	for range 4 {
		var page listJSON
		require.NoError(t, json.Unmarshal([]byte(requireOK(t, args...)), &page))
		for _, m := range page.Messages {
			seen = append(seen, m.MessageID.String())
		}
		if page.Next == "" {
			break
		}
		args = append(args, "--after", page.Next)
	}
	require.ElementsMatch(t, []string{ids[0].String(), ids[1].String(), ids[2].String()}, seen)

	out = requireOK(t, "list", "--queue", "inbox", "--status", "pending", "--limit", "1", "--database-url", url)
	require.Contains(t, out, "more: add --after pending.")
	out = requireOK(t, "list", "--queue", "inbox", "--error", "nothing like it", "--database-url", url)
	require.Equal(t, "no inbox messages match\n", out)
	out = requireOK(t, "list", "--queue", "inbox", "--older-than", "7d", "--database-url", url)
	require.Equal(t, "no inbox messages match\n", out)
}

// TestListOutboxTopics: the outbox's list has a TOPIC column with each
// row's topic; the inbox's, whose rows have none, does not.
func TestListOutboxTopics(t *testing.T) {
	t.Parallel()
	url := dbtest.DatabaseURL(t)
	_, err := storeFor(t, url, leasing.Outbox).Enqueue(t.Context(),
		leasing.NewMessage{Topic: "orders.created", Type: "order", Payload: []byte(`{}`)})
	require.NoError(t, err)
	listFixture(t, storeFor(t, url, leasing.Inbox))

	lines := strings.Split(requireOK(t, "list", "--queue", "outbox", "--database-url", url), "\n")
	require.Equal(t, []string{"MESSAGE", "ID", "STATUS", "TOPIC", "TYPE", "CREATED", "AT", "ATTEMPTS", "LAST", "ERROR"}, strings.Fields(lines[0]))
	require.Equal(t, []string{"pending", "orders.created", "order"}, strings.Fields(lines[1])[1:4])
	inbox := requireOK(t, "list", "--queue", "inbox", "--database-url", url)
	require.NotContains(t, inbox, "TOPIC")
}

func TestGetShowsPayload(t *testing.T) {
	t.Parallel()
	url := dbtest.DatabaseURL(t)
	ids := listFixture(t, storeFor(t, url, leasing.Inbox))

	out := requireOK(t, "get", "--queue", "inbox", "--id", ids[0].String(), "--database-url", url)
	require.Contains(t, out, "(json, below)")
	require.Contains(t, out, "payload:\n  {\n    \"order\": 7,\n    \"items\": [\n")
	out = requireOK(t, "get", "--queue", "inbox", "--id", ids[1].String(), "--database-url", url)
	require.Contains(t, out, "payload:\n  <script>alert(1)</script>\n")
	out = requireOK(t, "get", "--queue", "inbox", "--id", ids[2].String(), "--database-url", url)
	require.Contains(t, out, "3 bytes (binary)")
	require.NotContains(t, out, "payload:\n")

	var row struct {
		PayloadJSON json.RawMessage `json:"payload_json"`
		PayloadText *string         `json:"payload_text"`
	}
	require.NoError(t, json.Unmarshal([]byte(requireOK(t, "get", "--queue", "inbox", "--id", ids[0].String(), "--json", "--database-url", url)), &row))
	require.JSONEq(t, `{"order":7,"items":[1,2]}`, string(row.PayloadJSON))
	require.Nil(t, row.PayloadText)
}

func TestBulkCommand(t *testing.T) {
	t.Parallel()
	url := dbtest.DatabaseURL(t)
	store := storeFor(t, url, leasing.Inbox)
	ids := listFixture(t, store)
	digest := func() string { return dbtest.TableDigest(t, store.Pool()) }
	before := digest()

	out := requireOK(t, "bulk", "dead-letter", "--queue", "inbox", "--type", "a", "--reason", "misrouted", "--dry-run", "--database-url", url)
	require.Equal(t, "2 inbox messages matched: dead-letter would act on each (dry run, nothing changed)\n", out)
	require.Equal(t, before, digest())

	// Declined at the prompt: nothing changes, exit 1.
	var stdout, stderr bytes.Buffer
	code := runInput(t.Context(), strings.NewReader("n\n"), []string{"bulk", "purge", "--queue", "inbox", "--database-url", url}, &stdout, &stderr)
	require.Equal(t, 1, code, stderr.String())
	require.Contains(t, stderr.String(), "purge 3 inbox messages? [y/N] aborted: nothing changed")
	require.Equal(t, before, digest())

	// Confirmed: the two pending ones are dead-lettered.
	stdout.Reset()
	stderr.Reset()
	code = runInput(t.Context(), strings.NewReader("y\n"), []string{"bulk", "dead-letter", "--queue", "inbox", "--type", "a", "--reason", "misrouted", "--batch", "1", "--database-url", url}, &stdout, &stderr)
	require.Equal(t, 0, code, stderr.String())
	require.Equal(t, "dead-letter: 2 of 2 inbox messages matched, 0 left alone (in flight, leased or changed meanwhile), 2 batches\n", stdout.String())
	row, err := store.Get(t.Context(), ids[0])
	require.NoError(t, err)
	require.Equal(t, leasing.StatusDeadLettered, row.Status)
	require.Equal(t, "misrouted", row.LastError)

	out = requireOK(t, "bulk", "requeue", "--queue", "inbox", "--error", "misrouted", "--yes", "--database-url", url)
	require.Contains(t, out, "requeue: 2 of 2 inbox messages matched")
	out = requireOK(t, "bulk", "purge", "--queue", "inbox", "--yes", "--database-url", url)
	require.Contains(t, out, "purge: 3 of 3 inbox messages matched")
	out = requireOK(t, "bulk", "purge", "--queue", "inbox", "--yes", "--database-url", url)
	require.Equal(t, "no inbox messages match: nothing to purge\n", out)
}

// TestListAndBulkBadInput: every bad input of list, get and bulk exits 2
// with a message naming the flag, and changes nothing.
func TestListAndBulkBadInput(t *testing.T) {
	t.Parallel()
	url := dbtest.DatabaseURL(t)
	store := storeFor(t, url, leasing.Inbox)
	listFixture(t, store)
	before := dbtest.TableDigest(t, store.Pool())
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"list"}, "--queue is required"},
		{[]string{"list", "--queue", "inbox", "--status", "lost"}, `--status "lost" is not a status of the inbox queue: waiting, pending`},
		{[]string{"list", "--queue", "outbox", "--status", "processing"}, "not a status of the outbox queue"},
		{[]string{"list", "--queue", "inbox", "--after", "garbage"}, "--after \"garbage\" is not a cursor: want <status>.<unix microseconds>.<message id>"},
		{[]string{"list", "--queue", "inbox", "--status", "pending", "--after", "failed.1." + uuid.NewString()}, "--after is in status failed, but the filter keeps pending"},
		{[]string{"list", "--queue", "inbox", "--older-than", "7x"}, `"7x" is not a duration such as 90s, 15m, 36h, 7d or 1d12h`},
		{[]string{"list", "--queue", "inbox", "--limit", "0"}, "--limit must hold 1..10000 items"},
		{[]string{"list", "--queue", "inbox", "--topic", "t"}, "--topic only the outbox has topics"},
		{[]string{"list", "--queue", "outbox", "--idempotency-key", "k"}, "--idempotency-key only the inbox"},
		{[]string{"list", "--queue", "inbox", "extra"}, `unexpected argument "extra"`},
		{[]string{"bulk"}, "say what to do: leasectl bulk requeue|dead-letter|purge"},
		{[]string{"bulk", "--queue", "inbox"}, "say what to do"},
		{[]string{"bulk", "frob", "--queue", "inbox"}, `"frob" is not an action`},
		{[]string{"bulk", "requeue", "--queue", "inbox", "--status", "pending", "--yes"}, "--status requeue does not act on pending messages"},
		{[]string{"bulk", "purge", "--queue", "inbox", "--status", "processing", "--yes"}, "purge does not act on processing messages"},
		{[]string{"bulk", "dead-letter", "--queue", "inbox", "--yes"}, "--reason must not be blank"},
		{[]string{"bulk", "purge", "--queue", "inbox", "--force", "--yes"}, "--reason and --force are for dead-letter only"},
		{[]string{"bulk", "purge", "--queue", "inbox", "--batch", "0", "--yes"}, "--batch must hold 1..10000 items"},
		{[]string{"bulk", "purge", "--yes"}, "--queue is required"},
		{[]string{"purge", "--queue", "inbox", "--older-than", "7 days"}, "is not a duration such as"},
	} {
		r := leasectl(t, append(c.args, "--database-url", url)...)
		require.Equal(t, 2, r.code, "%v: stdout %s stderr %s", c.args, r.stdout, r.stderr)
		require.Contains(t, r.stderr, c.want, "%v", c.args)
	}
	require.Equal(t, before, dbtest.TableDigest(t, store.Pool()))
}
