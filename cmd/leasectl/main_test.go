package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/db"
	"github.com/leasestore/leasestore/internal/dbtest"
	"github.com/leasestore/leasestore/leasing"
)

// result is one leasectl run.
type result struct {
	code           int
	stdout, stderr string
}

// leasectl runs the command line args in process.
func leasectl(t *testing.T, args ...string) result {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := runContext(t.Context(), args, &stdout, &stderr)
	return result{code, stdout.String(), stderr.String()}
}

// requireOK runs args and requires exit status 0.
func requireOK(t *testing.T, args ...string) string {
	t.Helper()
	r := leasectl(t, args...)
	require.Equal(t, 0, r.code, "leasectl %s\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), r.stdout, r.stderr)
	return r.stdout
}

// unreachableURL returns a database URL on a port nothing listens on.
func unreachableURL(t *testing.T) string {
	t.Helper()
	port, err := freePort()
	require.NoError(t, err)
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable&connect_timeout=2", port)
}

// statsOut is the stats --json output.
type statsOut map[string]struct {
	Depth               map[string]int64 `json:"depth"`
	ExpiredLeases       int64            `json:"expired_leases"`
	OldestDueAgeSeconds float64          `json:"oldest_due_age_seconds"`
	OldestHead          *headJSON        `json:"oldest_head"`
}

func stats(t *testing.T, url string) statsOut {
	t.Helper()
	var out statsOut
	require.NoError(t, json.Unmarshal([]byte(requireOK(t, "stats", "--json", "--database-url", url)), &out))
	return out
}

func storeFor(t *testing.T, url string, q leasing.Queue) *leasing.Postgres {
	t.Helper()
	pool, err := pgxpool.New(t.Context(), url)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	store, err := leasing.NewPostgres(pool, q, leasing.PostgresOptions{})
	require.NoError(t, err)
	return store
}

// TestUsage covers the command list, help and unknown commands or flags.
func TestUsage(t *testing.T) {
	t.Parallel()

	t.Run("NoArgs", func(t *testing.T) {
		r := leasectl(t)
		require.Equal(t, 2, r.code)
		for _, cmd := range commands {
			require.Contains(t, r.stderr, "  "+cmd.name+" ")
		}
	})
	t.Run("Help", func(t *testing.T) {
		r := leasectl(t, "help")
		require.Equal(t, 0, r.code)
		require.Contains(t, r.stdout, "usage: leasectl")
		require.Contains(t, r.stdout, "migrate")
		require.Contains(t, r.stdout, "doctor")
		require.Empty(t, r.stderr)
	})
	t.Run("HelpCommand", func(t *testing.T) {
		r := leasectl(t, "help", "claim")
		require.Equal(t, 0, r.code)
		require.Contains(t, r.stdout, "-owner")
		require.Contains(t, r.stdout, "-lease")
	})
	t.Run("CommandDashH", func(t *testing.T) {
		r := leasectl(t, "purge", "-h")
		require.Equal(t, 0, r.code)
		require.Contains(t, r.stderr, "-older-than")
	})
	t.Run("DoctorAndBenchListDatabaseURL", func(t *testing.T) {
		for _, args := range [][]string{{"doctor", "--help"}, {"bench", "--help"}, {"help", "doctor"}, {"help", "bench"}} {
			r := leasectl(t, args...)
			require.Equal(t, 0, r.code, args)
			require.Contains(t, r.stdout+r.stderr, "-database-url URL", args)
			require.Contains(t, r.stdout+r.stderr, "$DATABASE_URL", args)
		}
	})
	t.Run("UnknownCommand", func(t *testing.T) {
		r := leasectl(t, "frobnicate")
		require.Equal(t, 2, r.code)
		require.Contains(t, r.stderr, `unknown command "frobnicate"`)
	})
	t.Run("UnknownGlobalFlag", func(t *testing.T) {
		r := leasectl(t, "--bogus", "stats")
		require.Equal(t, 2, r.code)
		require.Contains(t, r.stderr, "-bogus")
	})
	t.Run("RunWrapper", func(t *testing.T) {
		require.Equal(t, 0, run([]string{"help"}, io.Discard, io.Discard))
	})
}

// TestDatabaseURLDefault checks the URL order: DATABASE_URL, else the local server.
func TestDatabaseURLDefault(t *testing.T) {
	t.Parallel()

	c := newCLI(io.Discard, io.Discard, func(string) string { return "" })
	require.Equal(t, defaultDatabaseURL, c.databaseURL)
	require.Equal(t, urlDefault, c.source)

	c = newCLI(io.Discard, io.Discard, func(k string) string {
		if k == "DATABASE_URL" {
			return "postgres://u@h/d"
		}
		return ""
	})
	require.Equal(t, "postgres://u@h/d", c.databaseURL)
	require.Equal(t, urlEnv, c.source)
}

// badFlagCases are command lines that must exit 2 before connecting.
var badFlagCases = []struct {
	name string
	args []string
	want string
}{
	{"EnqueueNoQueue", []string{"enqueue", "--count", "1"}, "--queue is required"},
	{"EnqueueUnknownQueue", []string{"enqueue", "--queue", "sidebox"}, "inbox or outbox"},
	{"EnqueueCountZero", []string{"enqueue", "--queue", "inbox", "--count", "0"}, "--count"},
	{"EnqueueCountNotANumber", []string{"enqueue", "--queue", "inbox", "--count", "x"}, "-count"},
	{"EnqueueNegativeDelay", []string{"enqueue", "--queue", "inbox", "--delay", "-1s"}, "--delay"},
	{"EnqueueTopicOnInbox", []string{"enqueue", "--queue", "inbox", "--topic", "t"}, "--topic"},
	{"EnqueueTypeNotUTF8", []string{"enqueue", "--queue", "inbox", "--type", "order\xff"}, "--type must be UTF-8 without NUL"},
	{"EnqueueTenantWithNUL", []string{"enqueue", "--queue", "inbox", "--tenant", "t\x00"}, "--tenant must be UTF-8 without NUL"},
	{"EnqueueTopicNotUTF8", []string{"enqueue", "--queue", "outbox", "--topic", "\xc3"}, "--topic must be UTF-8 without NUL"},
	{"EnqueueOrderingKeyTooLong", []string{"enqueue", "--queue", "inbox", "--ordering-key", strings.Repeat("k", leasing.MaxOrderingKeyBytes+1)}, "--ordering-key must be at most 256 bytes, got 257"},
	{"EnqueueTenantTooLong", []string{"enqueue", "--queue", "inbox", "--tenant", strings.Repeat("t", leasing.MaxTenantIDBytes+1)}, "--tenant must be at most 256 bytes, got 257"},
	{"ClaimTenantTooLong", []string{"claim", "--queue", "inbox", "--owner", "w", "--tenant", strings.Repeat("t", leasing.MaxTenantIDBytes+1)}, "--tenant must be at most 256 bytes, got 257"},
	{"EnqueueOrderingKeyNotUTF8", []string{"enqueue", "--queue", "outbox", "--ordering-key", "k\xff"}, "--ordering-key must be valid UTF-8"},
	{"EnqueueOrderingKeyWithNUL", []string{"enqueue", "--queue", "inbox", "--ordering-key", "k\x00"}, "--ordering-key must not contain NUL"},
	{"EnqueueUnknownFlag", []string{"enqueue", "--queue", "inbox", "--colour", "red"}, "-colour"},
	{"EnqueueExtraArgument", []string{"enqueue", "--queue", "inbox", "extra"}, `unexpected argument "extra"`},
	{"ClaimBatchZero", []string{"claim", "--queue", "inbox", "--owner", "ops", "--batch", "0"}, "--batch"},
	{"ClaimBatchTooLarge", []string{"claim", "--queue", "outbox", "--owner", "ops", "--batch", "10001"}, "--batch"},
	{"ClaimNegativeLease", []string{"claim", "--queue", "inbox", "--owner", "ops", "--lease", "-1s"}, "--lease"},
	{"ClaimZeroLease", []string{"claim", "--queue", "inbox", "--owner", "ops", "--lease", "0s"}, "--lease"},
	{"ClaimNoOwner", []string{"claim", "--queue", "inbox", "--batch", "1"}, "--owner"},
	{"ClaimEmptyOwner", []string{"claim", "--queue", "inbox", "--owner", ""}, "--owner"},
	{"ClaimUnknownQueue", []string{"claim", "--queue", "Inbox", "--owner", "ops"}, "inbox or outbox"},
	{"ClaimTenantNotUTF8", []string{"claim", "--queue", "inbox", "--owner", "ops", "--tenant", "\xff"}, "--tenant must be UTF-8 without NUL"},
	{"StatsUnknownQueue", []string{"stats", "--queue", "x"}, "inbox or outbox"},
	{"StatsExtraArgument", []string{"stats", "now"}, "unexpected argument"},
	{"RequeueNeither", []string{"requeue", "--queue", "inbox"}, "--id ID (repeatable) or --all"},
	{"RequeueBoth", []string{"requeue", "--queue", "inbox", "--all", "--id", "0190a3c4-0000-7000-8000-000000000001"}, "mutually exclusive"},
	{"RequeueBadID", []string{"requeue", "--queue", "inbox", "--id", "42"}, "not a UUID"},
	{"RequeueSameIDTwice", []string{"requeue", "--queue", "inbox", "--id", "0190a3c4-0000-7000-8000-000000000001", "--id", "0190a3c4-0000-7000-8000-000000000001"}, "appears twice"},
	{"RequeueNoQueue", []string{"requeue", "--all"}, "--queue is required"},
	{"RequeueNilID", []string{"requeue", "--queue", "inbox", "--id", uuid.Nil.String()}, "must not be the nil UUID"},
	{"RequeueNilIDAmongOthers", []string{"requeue", "--queue", "outbox", "--id", "0190a3c4-0000-7000-8000-000000000001", "--id", uuid.Nil.String()}, "must not be the nil UUID"},
	{"GetNilID", []string{"get", "--queue", "inbox", "--id", uuid.Nil.String()}, "must not be the nil UUID"},
	{"PurgeNoOlderThan", []string{"purge", "--queue", "inbox"}, "--older-than"},
	{"PurgeBatchZero", []string{"purge", "--queue", "inbox", "--older-than", "1h", "--batch", "0"}, "--batch"},
	{"MigrateNoAction", []string{"migrate"}, "up, down or status"},
	{"MigrateUnknownAction", []string{"migrate", "sideways"}, `unknown migrate action "sideways"`},
	{"MigrateTwoActions", []string{"migrate", "up", "down"}, `unexpected argument "down"`},
	{"ServeUnknownQueue", []string{"serve", "--queue", "x"}, "inbox or outbox"},
	{"ServeMetricsAddrNonsense", []string{"serve", "--metrics-addr", "nonsense"}, "--metrics-addr must be [host]:port"},
	{"ServeMetricsAddrPortTooLarge", []string{"serve", "--metrics-addr", ":99999"}, "port must be 0..65535"},
	{"ServeMetricsAddrNoPort", []string{"serve", "--metrics-addr", "127.0.0.1:"}, "port must be"},
	{"ServeMetricsAddrUnknownService", []string{"serve", "--metrics-addr", "localhost:nosuchservice"}, "port must be"},
	{"EmptyDatabaseURL", []string{"stats", "--database-url", ""}, "-database-url"},
}

// TestBadFlags runs each bad command line against a server that does not
// exist: exit status 2 (not 1) shows that leasectl never tried to connect.
func TestBadFlags(t *testing.T) {
	t.Parallel()
	url := unreachableURL(t)
	for _, tc := range badFlagCases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := leasectl(t, append(tc.args, "--database-url", url)...)
			require.Equal(t, 2, r.code, "stdout:\n%s\nstderr:\n%s", r.stdout, r.stderr)
			require.Contains(t, r.stderr, tc.want)
			require.Contains(t, r.stderr, "leasectl "+tc.args[0])
			require.Empty(t, r.stdout)
		})
	}
}

// TestBadFlagsChangeNothing runs each bad command line against a database
// holding messages and checks that no row changed.
func TestBadFlagsChangeNothing(t *testing.T) {
	t.Parallel()
	url := dbtest.DatabaseURL(t)
	requireOK(t, "enqueue", "--queue", "inbox", "--count", "3", "--database-url", url)
	requireOK(t, "enqueue", "--queue", "outbox", "--count", "2", "--database-url", url)
	before := stats(t, url)

	for _, tc := range badFlagCases {
		if tc.name == "EmptyDatabaseURL" {
			continue
		}
		r := leasectl(t, append(tc.args, "--database-url", url)...)
		require.Equal(t, 2, r.code, "%s: stderr:\n%s", tc.name, r.stderr)
	}

	after := stats(t, url)
	for q := range before {
		require.Equal(t, before[q].Depth, after[q].Depth, q)
	}
	require.Equal(t, int64(3), after["inbox"].Depth["pending"])
	require.Equal(t, int64(2), after["outbox"].Depth["pending"])
}

// TestMigrate runs migrate status, up, down and up again on an empty database.
func TestMigrate(t *testing.T) {
	t.Parallel()
	url := dbtest.NewEmptyDatabase(t)
	files, err := fs.Glob(db.Migrations(), "*.sql")
	require.NoError(t, err)
	n := len(files)
	require.Positive(t, n)

	// The latest version is the last file's number, which is n only when
	// no number is missing (branches may add migrations out of order).
	var latestVersion int
	_, err = fmt.Sscanf(files[n-1], "%05d_", &latestVersion)
	require.NoError(t, err)
	out := requireOK(t, "migrate", "status", "--database-url", url)
	require.Contains(t, out, fmt.Sprintf("schema version 0 (latest %d, %d pending)", latestVersion, n))
	require.Equal(t, n, strings.Count(out, "pending  -"))

	out = requireOK(t, "--database-url", url, "migrate", "up")
	require.Equal(t, n, strings.Count(out, "OK    up"))
	latest := strings.TrimSuffix(files[n-1], ".sql")
	require.Contains(t, out, latest)

	out = requireOK(t, "migrate", "--database-url", url, "status")
	require.Contains(t, out, "0 pending")
	require.Equal(t, n, strings.Count(out, "applied  "))

	out = requireOK(t, "migrate", "up", "--database-url", url)
	require.Contains(t, out, "no pending migrations")

	out = requireOK(t, "migrate", "down", "--database-url", url)
	require.Contains(t, out, "OK    down "+files[n-1])
	out = requireOK(t, "migrate", "status", "--database-url", url)
	require.Contains(t, out, "1 pending")

	requireOK(t, "migrate", "up", "--database-url", url)
	out = requireOK(t, "migrate", "status", "--database-url", url)
	require.Contains(t, out, "0 pending")
}

// TestMissingSchemaHint checks that a command on an unmigrated database says how to fix it.
func TestMissingSchemaHint(t *testing.T) {
	t.Parallel()
	url := dbtest.NewEmptyDatabase(t)
	r := leasectl(t, "stats", "--database-url", url)
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "leasectl migrate up")
}

// TestUnreachableServer checks that a server that does not answer is a runtime failure (exit 1).
func TestUnreachableServer(t *testing.T) {
	t.Parallel()
	r := leasectl(t, "stats", "--database-url", unreachableURL(t))
	require.Equal(t, 1, r.code)
	require.Contains(t, r.stderr, "cannot reach PostgreSQL")
}

// TestUnreachableServerSaysItOnce: with sslmode=prefer (the default) pgx
// dials twice, with and without TLS; the refusal is printed once, the
// password never, for each way of connecting (the pool checked at once,
// the lazy pool of a store call, doctor's and bench's own).
func TestUnreachableServerSaysItOnce(t *testing.T) {
	t.Parallel()
	port, err := freePort()
	require.NoError(t, err)
	url := fmt.Sprintf("postgres://postgres:s3cret@127.0.0.1:%d/postgres?connect_timeout=2", port)
	for _, args := range [][]string{
		{"stats"}, {"migrate", "status"}, {"requeue", "--queue", "inbox", "--all"},
		{"doctor"}, {"bench", "--messages", "10", "--no-raw"},
	} {
		r := leasectl(t, append(args, "--database-url", url)...)
		require.Equal(t, 1, r.code, "%v: stderr:\n%s", args, r.stderr)
		require.Equal(t, 1, strings.Count(r.stderr, "connection refused"), "%v: stderr:\n%s", args, r.stderr)
		require.NotContains(t, r.stderr, "s3cret", args)
		require.Empty(t, r.stdout, args)
	}
}

// TestDatabaseURLScheme: a URL of another database is bad input (exit 2,
// nothing tried) that names the scheme expected, and never prints the
// password, nor the URL pgx could not parse.
func TestDatabaseURLScheme(t *testing.T) {
	t.Parallel()
	for _, u := range []string{"mysql://root:s3cret@db.example:3306/app", "http://root:s3cret@db.example/", "root:s3cret@db.example://app"} {
		for _, args := range [][]string{
			{"stats"}, {"migrate", "up"}, {"enqueue", "--queue", "inbox"}, {"requeue", "--queue", "inbox", "--all"},
			{"serve"}, {"doctor"}, {"bench"},
		} {
			r := leasectl(t, append(args, "--database-url", u)...)
			require.Equal(t, 2, r.code, "%s %v: stderr:\n%s", u, args, r.stderr)
			require.Contains(t, r.stderr, "scheme must be postgres:// or postgresql://", args)
			require.NotContains(t, r.stderr, "s3cret", args)
			require.NotContains(t, r.stderr, "db.example", args)
			require.Empty(t, r.stdout, args)
		}
	}
	r := leasectl(t, "--database-url", "mysql://root:s3cret@db.example:3306/app", "stats")
	require.Contains(t, r.stderr, "got mysql://")

	r = leasectl(t, "--database-url", "POSTGRES://u:s3cret@db.example/d", "stats")
	require.Equal(t, 2, r.code)
	require.Contains(t, r.stderr, "got POSTGRES://", "pgx takes the scheme in lower case only")
	require.NotContains(t, r.stderr, "s3cret")

	for _, u := range []string{"postgres://u@h/d", "postgresql://u@h/d", "host=h user=u dbname=d"} {
		c := newCLI(io.Discard, io.Discard, func(string) string { return "" })
		c.databaseURL = u
		_, err := c.poolConfig()
		require.NoError(t, err, u)
	}
}

// TestEnqueueStats enqueues on both queues (one batch and more than one) and reads stats as JSON and text.
func TestEnqueueStats(t *testing.T) {
	t.Parallel()
	url := dbtest.DatabaseURL(t)

	var enq struct {
		Queue    string      `json:"queue"`
		Enqueued int         `json:"enqueued"`
		IDs      []uuid.UUID `json:"ids"`
	}
	out := requireOK(t, "enqueue", "--queue", "inbox", "--count", "3", "--tenant", "t1",
		"--type", "order.placed", "--payload", `{"n":1}`, "--json", "--database-url", url)
	require.NoError(t, json.Unmarshal([]byte(out), &enq))
	require.Equal(t, "inbox", enq.Queue)
	require.Equal(t, 3, enq.Enqueued)
	require.Len(t, enq.IDs, 3)
	row, err := storeFor(t, url, leasing.Inbox).Get(t.Context(), enq.IDs[0])
	require.NoError(t, err)
	require.Equal(t, "t1", row.TenantID)
	require.Equal(t, "order.placed", row.Type)
	require.Equal(t, `{"n":1}`, string(row.Payload))
	out = requireOK(t, "enqueue", "--queue", "inbox", "--database-url", url)
	require.Equal(t, "enqueued 1 inbox message (due now)\n", out)

	// More than one batch: leasing.MaxBatchSize + 1 messages, delayed.
	out = requireOK(t, "enqueue", "--queue", "outbox", "--count", fmt.Sprint(leasing.MaxBatchSize+1),
		"--delay", "1h", "--topic", "orders", "--database-url", url)
	require.Contains(t, out, fmt.Sprintf("enqueued %d outbox messages (due in 1h0m0s)", leasing.MaxBatchSize+1))

	st := stats(t, url)
	require.Equal(t, map[string]int64{
		"pending": 4, "processing": 0, "completed": 0, "failed": 0, "dead_lettered": 0, "waiting": 0,
	}, st["inbox"].Depth)
	require.Equal(t, map[string]int64{
		"pending": int64(leasing.MaxBatchSize + 1), "publishing": 0, "published": 0, "failed": 0, "dead_lettered": 0, "waiting": 0,
	}, st["outbox"].Depth)
	require.Zero(t, st["outbox"].OldestDueAgeSeconds, "delayed rows are not due")
	require.Zero(t, st["inbox"].ExpiredLeases)

	var only statsOut
	require.NoError(t, json.Unmarshal([]byte(requireOK(t, "stats", "--json", "--queue", "inbox", "--database-url", url)), &only))
	require.Len(t, only, 1)
	require.Contains(t, only, "inbox")

	text := requireOK(t, "stats", "--database-url", url)
	require.Regexp(t, `(?m)^inbox$`, text)
	require.Regexp(t, `(?m)^  pending +4$`, text)
	require.Regexp(t, `(?m)^  dead_lettered +0$`, text)
	require.Contains(t, text, "expired leases")
	require.Contains(t, text, "oldest due age")
}

// TestClaim claims with JSON and text output, with and without a tenant.
func TestClaim(t *testing.T) {
	t.Parallel()
	url := dbtest.DatabaseURL(t)
	requireOK(t, "enqueue", "--queue", "inbox", "--count", "3", "--database-url", url)
	requireOK(t, "enqueue", "--queue", "inbox", "--count", "1", "--tenant", "t2", "--database-url", url)

	var claimed struct {
		Queue        string  `json:"queue"`
		Owner        string  `json:"owner"`
		LeaseSeconds float64 `json:"lease_seconds"`
		Leases       []struct {
			MessageID  uuid.UUID `json:"message_id"`
			Owner      string    `json:"owner"`
			Generation int64     `json:"generation"`
			Attempt    int       `json:"attempt"`
			ExpiresAt  time.Time `json:"expires_at"`
			TenantID   string    `json:"tenant_id"`
		} `json:"leases"`
	}
	r := leasectl(t, "claim", "--queue", "inbox", "--owner", "ops-1", "--batch", "2", "--lease", "1m", "--json", "--database-url", url)
	require.Equal(t, 0, r.code, r.stderr)
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &claimed))
	require.Contains(t, r.stderr, "expire")
	require.Equal(t, "ops-1", claimed.Owner)
	require.Equal(t, 60.0, claimed.LeaseSeconds)
	require.Len(t, claimed.Leases, 2)
	for _, l := range claimed.Leases {
		require.Equal(t, "ops-1", l.Owner, "the owner is used as given")
		require.Equal(t, int64(1), l.Generation)
		require.Equal(t, 1, l.Attempt)
		require.WithinDuration(t, time.Now().Add(time.Minute), l.ExpiresAt, 30*time.Second)
		row, err := storeFor(t, url, leasing.Inbox).Get(t.Context(), l.MessageID)
		require.NoError(t, err)
		require.Equal(t, leasing.StatusProcessing, row.Status)
		require.Equal(t, "ops-1", row.LeaseOwner)
	}

	out := requireOK(t, "claim", "--queue", "inbox", "--owner", "ops-2", "--tenant", "t2", "--database-url", url)
	require.Contains(t, out, `claimed 1 inbox message for owner "ops-2"`)
	require.Contains(t, out, "MESSAGE ID")
	require.Contains(t, out, "expire")

	out = requireOK(t, "claim", "--queue", "inbox", "--owner", "ops-2", "--tenant", "t2", "--database-url", url)
	require.Contains(t, out, "no due inbox messages")

	st := stats(t, url)
	require.Equal(t, int64(3), st["inbox"].Depth["processing"])
	require.Equal(t, int64(1), st["inbox"].Depth["pending"])
}

// TestClaimPrintsLeasesBesideParkedRows: a claim that parks a row it
// cannot lease (headers that are not a JSON object, written by hand)
// still prints the leases it took, exits 0, and names the parked row.
func TestClaimPrintsLeasesBesideParkedRows(t *testing.T) {
	t.Parallel()
	url := dbtest.DatabaseURL(t)
	requireOK(t, "enqueue", "--queue", "inbox", "--count", "3", "--database-url", url)
	store := storeFor(t, url, leasing.Inbox)
	rows, err := store.List(t.Context(), time.Time{}, uuid.Nil, 3)
	require.NoError(t, err)
	bad := rows[0].ID
	_, err = store.Pool().Exec(t.Context(), "UPDATE inbox_messages SET headers = '[1]' WHERE message_id = $1", bad)
	require.NoError(t, err)

	r := leasectl(t, "claim", "--queue", "inbox", "--owner", "ops", "--batch", "10", "--json", "--database-url", url)
	require.Equal(t, 0, r.code, r.stderr)
	var claimed struct {
		Leases []struct {
			MessageID uuid.UUID `json:"message_id"`
		} `json:"leases"`
		Parked []struct {
			MessageID uuid.UUID `json:"message_id"`
			Reason    string    `json:"reason"`
		} `json:"parked"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &claimed))
	require.Len(t, claimed.Leases, 2)
	require.Len(t, claimed.Parked, 1)
	require.Equal(t, bad, claimed.Parked[0].MessageID)
	require.Contains(t, claimed.Parked[0].Reason, "not an object")
	require.Contains(t, r.stderr, "parked inbox message "+bad.String())
}

// TestRequeue checks that only dead-lettered messages are requeued and the counts printed.
func TestRequeue(t *testing.T) {
	t.Parallel()
	url := dbtest.DatabaseURL(t)
	store := storeFor(t, url, leasing.Inbox)
	ctx := t.Context()

	res, err := store.Enqueue(ctx, leasing.NewMessage{}, leasing.NewMessage{})
	require.NoError(t, err)
	pending, dead := res.IDs[0], res.IDs[1]
	leases, err := store.Claim(ctx, leasing.ClaimRequest{Owner: "test", BatchSize: 2, LeaseFor: time.Minute})
	require.NoError(t, err)
	require.Len(t, leases, 2)
	_, err = store.Release(ctx, leases[0])
	require.NoError(t, err)
	written, err := store.DeadLetter(ctx, leasing.Failure{Lease: leases[1], Error: "boom"})
	require.NoError(t, err)
	require.NoError(t, written.Err())

	// An id left alone is a failure, as get and dead-letter of a missing
	// message are: exit 1, naming the id and why.
	r := leasectl(t, "requeue", "--queue", "inbox", "--id", pending.String(), "--database-url", url)
	require.Equal(t, 1, r.code, r.stderr)
	require.Equal(t, "requested 1, requeued 0\n", r.stdout)
	require.Contains(t, r.stderr, "inbox message "+pending.String()+" was not dead-lettered (now pending)")
	unknown := uuid.New()
	r = leasectl(t, "requeue", "--queue", "inbox", "--id", unknown.String(), "--database-url", url)
	require.Equal(t, 1, r.code, r.stderr)
	require.Contains(t, r.stderr, "inbox message "+unknown.String()+" not found")
	row, err := store.Get(ctx, pending)
	require.NoError(t, err)
	require.Equal(t, leasing.StatusPending, row.Status)

	out := requireOK(t, "requeue", "--queue", "outbox", "--all", "--database-url", url)
	require.Contains(t, out, "requested 0, requeued 0")

	type requeueOut struct {
		Queue       string      `json:"queue"`
		Requested   int         `json:"requested"`
		Requeued    int         `json:"requeued"`
		RequeuedIDs []uuid.UUID `json:"requeued_ids"`
		NotRequeued []uuid.UUID `json:"not_requeued"`
	}
	var all requeueOut
	require.NoError(t, json.Unmarshal([]byte(requireOK(t, "requeue", "--queue", "outbox", "--all", "--json", "--database-url", url)), &all))
	require.Equal(t, requeueOut{Queue: "outbox", RequeuedIDs: []uuid.UUID{}, NotRequeued: []uuid.UUID{}}, all)

	// The ids given that are dead-lettered are requeued beside those left
	// alone; the output says which were which, and the exit status 1.
	var got requeueOut
	missing := uuid.New()
	r = leasectl(t, "requeue", "--queue", "inbox", "--id", dead.String(), "--id", pending.String(), "--id", missing.String(), "--json", "--database-url", url)
	require.Equal(t, 1, r.code, r.stderr)
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &got), r.stdout)
	require.Equal(t, requeueOut{
		Queue: "inbox", Requested: 3, Requeued: 1, RequeuedIDs: []uuid.UUID{dead}, NotRequeued: []uuid.UUID{pending, missing},
	}, got, "the ids left alone are listed, in the order given")
	require.Contains(t, r.stdout, `"not_requeued"`)
	require.Contains(t, r.stderr, pending.String()+" was not dead-lettered (now pending); inbox message "+missing.String()+" not found")
	require.NotContains(t, r.stderr, dead.String())
	row, err = store.Get(ctx, dead)
	require.NoError(t, err)
	require.Equal(t, leasing.StatusPending, row.Status)
	require.Zero(t, row.AttemptCount)
	require.Empty(t, row.LastError)
}

// TestPurge purges finished messages in batches and keeps active and (by default) dead-lettered ones.
func TestPurge(t *testing.T) {
	t.Parallel()
	url := dbtest.DatabaseURL(t)
	store := storeFor(t, url, leasing.Inbox)
	ctx := t.Context()

	requireOK(t, "enqueue", "--queue", "inbox", "--count", "26", "--database-url", url)
	leases, err := store.Claim(ctx, leasing.ClaimRequest{Owner: "test", BatchSize: 26, LeaseFor: time.Minute})
	require.NoError(t, err)
	written, err := store.Complete(ctx, leases[:25]...)
	require.NoError(t, err)
	require.NoError(t, written.Err())
	written, err = store.DeadLetter(ctx, leasing.Failure{Lease: leases[25], Error: "boom"})
	require.NoError(t, err)
	require.NoError(t, written.Err())
	requireOK(t, "enqueue", "--queue", "inbox", "--count", "2", "--database-url", url)

	out := requireOK(t, "purge", "--queue", "inbox", "--older-than", "1h", "--database-url", url)
	require.Contains(t, out, "purged 0 ")
	require.Equal(t, int64(25), stats(t, url)["inbox"].Depth["completed"])

	// 25 rows in batches of 2: 13 statements; not a terminal, so one
	// progress line after 10 batches.
	r := leasectl(t, "purge", "--queue", "inbox", "--older-than", "1us", "--batch", "2", "--database-url", url)
	require.Equal(t, 0, r.code, r.stderr)
	require.Contains(t, r.stdout, "purged 25 finished inbox messages")
	require.Equal(t, "purge inbox: 20 deleted in 10 batches\n", r.stderr)
	st := stats(t, url)["inbox"].Depth
	require.Equal(t, int64(0), st["completed"])
	require.Equal(t, int64(1), st["dead_lettered"], "dead-lettered rows are kept by default")
	require.Equal(t, int64(2), st["pending"], "active rows are never purged")

	out = requireOK(t, "purge", "--queue", "inbox", "--older-than", "1us", "--include-dead-lettered", "--database-url", url)
	require.Contains(t, out, "purged 1 finished and dead-lettered inbox message older than 1µs")
	st = stats(t, url)["inbox"].Depth
	require.Equal(t, int64(0), st["dead_lettered"])
	require.Equal(t, int64(2), st["pending"])
}

// syncBuffer is a bytes.Buffer safe for one writer and one reader.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write appends p.
func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns what was written so far.
func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestServe scrapes the queue-depth gauges from serve and stops it by cancelling its context.
func TestServe(t *testing.T) {
	t.Parallel()
	url := dbtest.DatabaseURL(t)
	requireOK(t, "enqueue", "--queue", "inbox", "--count", "2", "--database-url", url)

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var stdout, stderr syncBuffer
	exited := make(chan int, 1)
	go func() {
		exited <- runContext(ctx, []string{"serve", "--metrics-addr", "127.0.0.1:0", "--database-url", url}, &stdout, &stderr)
	}()

	addr := regexp.MustCompile(`http://(\S+)/metrics`)
	var metricsURL string
	require.Eventually(t, func() bool {
		m := addr.FindStringSubmatch(stdout.String())
		if m != nil {
			metricsURL = "http://" + m[1] + "/metrics"
		}
		return m != nil
	}, 10*time.Second, 10*time.Millisecond, "stderr: %s", &stderr)
	_, _, err := net.SplitHostPort(strings.TrimPrefix(strings.TrimSuffix(metricsURL, "/metrics"), "http://"))
	require.NoError(t, err)

	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, metricsURL, nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, resp.Body.Close())
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	metrics := string(body)
	require.Regexp(t, `(?m)^litebus_inbox_queue_depth\{.*status="pending".*\} 2$`, metrics)
	require.Regexp(t, `(?m)^litebus_inbox_queue_depth\{.*status="processing".*\} 0$`, metrics)
	require.Regexp(t, `(?m)^litebus_outbox_queue_depth\{.*status="publishing".*\} 0$`, metrics)
	require.Contains(t, metrics, "litebus_inbox_queue_expired_leases")
	require.Contains(t, metrics, "litebus_outbox_queue_oldest_due_age_seconds")

	cancel()
	select {
	case code := <-exited:
		require.Equal(t, 0, code, stderr.String())
	case <-time.After(10 * time.Second):
		t.Fatal("serve did not stop after its context was cancelled")
	}
}

// TestDoctorAndBenchFlags: doctor and bench parse their own flags after
// --database-url is taken out, wherever it stands, and reject bad flags
// with exit status 2 before connecting.
func TestDoctorAndBenchFlags(t *testing.T) {
	t.Parallel()
	unreachable := unreachableURL(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"doctor", "--batch", "0", "--database-url", unreachable}, "batch must be"},
		{[]string{"doctor", "--database-url=" + unreachable, "--queue", "x"}, "inbox or outbox"},
		{[]string{"doctor", "--database-url", "postgres://%zz"}, "bad database URL"},
		{[]string{"doctor", "--max-oldest-due", "-1m", "--database-url", unreachable}, "--max-oldest-due must be positive, got -1m0s"},
		{[]string{"doctor", "--max-oldest-due", "0s", "--database-url", unreachable}, "--max-oldest-due must be positive"},
		{[]string{"doctor", "--max-xact-age", "-5m", "--database-url", unreachable}, "--max-xact-age must be positive"},
		{[]string{"doctor", "--max-dead-tuples", "-1", "--database-url", unreachable}, "--max-dead-tuples must be at least 1"},
		{[]string{"doctor", "--max-claim-buffers", "-1", "--database-url", unreachable}, "--max-claim-buffers must be >= 0"},
		{[]string{"bench", "--database-url", unreachable, "--rounds", "21"}, "rounds must be"},
		{[]string{"bench", "--messages", "10", "--database-url"}, "flag needs an argument"},
		{[]string{"bench", "--rounds", "0", "--database-url", unreachable}, "--rounds must not be 0"},
		{[]string{"bench", "--messages", "0", "--database-url", unreachable}, "--messages must not be 0"},
	} {
		r := leasectl(t, tc.args...)
		require.Equal(t, 2, r.code, "%v: stderr:\n%s", tc.args, r.stderr)
		require.Contains(t, r.stderr, tc.want, tc.args)
	}

	url := dbtest.DatabaseURL(t)
	r := leasectl(t, "doctor", "--json", "--database-url", url, "--queue", "inbox")
	require.Contains(t, []int{0, 1}, r.code, r.stderr) // 1 on a server with autovacuum off
	var rep struct {
		Queues []struct {
			Queue string `json:"queue"`
		} `json:"queues"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &rep), r.stdout)
	require.Len(t, rep.Queues, 1)
	require.Equal(t, "inbox", rep.Queues[0].Queue)
}

// freePort returns a loopback TCP port that nothing listened on a moment ago.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}
