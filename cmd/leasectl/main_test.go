package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

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

// freePort returns a loopback TCP port that nothing listened on a moment ago.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}
