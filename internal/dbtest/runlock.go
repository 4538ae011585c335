package dbtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"regexp"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/leasestore/leasestore/internal/pgadmin"
)

// serverURL returns the maintenance database URL of the server that
// tests and examples use: TEST_DATABASE_URL, else DATABASE_URL, else
// DefaultURL.
func serverURL() string {
	if u := os.Getenv("TEST_DATABASE_URL"); u != "" {
		return u
	}
	if u := os.Getenv("DATABASE_URL"); u != "" {
		return u
	}
	return DefaultURL
}

// DatabasePrefix starts the name of every test database; RolePrefix the
// name of every per-test role. The rest of the name is <run>_<random>,
// <run> being 8 hex digits that identify the test process (RunID), so that
// a sweep can tell a live run's objects from those of a dead one.
const (
	DatabasePrefix = "leasestore_test_"
	RolePrefix     = "leasestore_t_"
)

// runLockClass is the first key of the two-key session advisory lock that
// a live run holds on the maintenance database; the second is the run.
const runLockClass int32 = 0x6c736474 // "lsdt"

var (
	// runID identifies this process's databases and roles.
	runID = randomHex(4)

	runMu     sync.Mutex
	runHolder *pgx.Conn // holds the run's advisory lock; nil until first used
	runAdmin  string    // the maintenance database runHolder is on
)

var (
	testDatabaseName = regexp.MustCompile(`^` + DatabasePrefix + `([0-9a-f]{8})_[0-9a-f]+$`)
	testRoleName     = regexp.MustCompile(`^` + RolePrefix + `([0-9a-f]{8})_[0-9a-f]+$`)
)

// RunID returns the 8 hex digits that name this process's test databases
// and roles.
func RunID() string { return runID }

// randomHex returns n random bytes as 2n hex digits.
func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // never fails since Go 1.24
	return hex.EncodeToString(b)
}

// newDatabaseName returns a new database name of this run,
// leasestore_test_<run>_<random>, after making sure that this process
// holds its run lock on admin's server (holdRun).
func newDatabaseName(ctx context.Context, admin string) (string, error) {
	if err := holdRun(ctx, admin); err != nil {
		return "", err
	}
	return DatabasePrefix + runID + "_" + randomHex(8), nil
}

// newRoleName returns a new role name of this run,
// leasestore_t_<run>_<random>, after making sure that this process holds
// its run lock on admin's server (holdRun).
func newRoleName(ctx context.Context, admin string) (string, error) {
	if err := holdRun(ctx, admin); err != nil {
		return "", err
	}
	return RolePrefix + runID + "_" + randomHex(6), nil
}

// databaseRun returns the run of a test database name, and false for
// a name that is not one (newDatabaseName).
func databaseRun(name string) (string, bool) { return runOf(testDatabaseName, name) }

// roleRun returns the run of a per-test role name, and false for a
// name that is not one (newRoleName).
func roleRun(name string) (string, bool) { return runOf(testRoleName, name) }

func runOf(re *regexp.Regexp, name string) (string, bool) {
	if m := re.FindStringSubmatch(name); m != nil {
		return m[1], true
	}
	return "", false
}

// holdRun makes sure this process holds its run lock on admin's server,
// connecting (again, after the server restarted) when it does not. It
// waits while a sweep holds the lock, which happens only when the server
// lost this run's session: the sweep then drops what the run had created,
// and the run goes on with new objects.
func holdRun(ctx context.Context, admin string) error {
	runMu.Lock()
	defer runMu.Unlock()
	if runHolder != nil && runAdmin == admin {
		pingCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := runHolder.Ping(pingCtx)
		cancel()
		if err == nil {
			return nil
		}
		_ = runHolder.Close(context.Background())
		runHolder = nil
	}
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		return fmt.Errorf("connect for the run lock: %w", err)
	}
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1, $2)", runLockClass, runKey(runID)); err != nil {
		_ = conn.Close(context.Background())
		return fmt.Errorf("take the run lock: %w", err)
	}
	runHolder, runAdmin = conn, admin
	return nil
}

// runAdminURL returns the maintenance database URL this process holds its run
// lock on, or "" when it holds none.
func runAdminURL() string {
	runMu.Lock()
	defer runMu.Unlock()
	if runHolder == nil {
		return ""
	}
	return runAdmin
}

// releaseRun closes the run lock's session, if any.
func releaseRun() {
	runMu.Lock()
	defer runMu.Unlock()
	if runHolder != nil {
		_ = runHolder.Close(context.Background())
		runHolder = nil
	}
}

// tryLockRun takes run's lock on conn's session if no process holds it,
// that is, if run is dead, and reports whether it did. unlockRun gives it
// back.
func tryLockRun(ctx context.Context, conn *pgx.Conn, run string) (bool, error) {
	var dead bool
	err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1, $2)", runLockClass, runKey(run)).Scan(&dead)
	return dead, err
}

// unlockRun releases run's lock that tryLockRun took on conn's session.
func unlockRun(ctx context.Context, conn *pgx.Conn, run string) error {
	_, err := conn.Exec(ctx, "SELECT pg_advisory_unlock($1, $2)", runLockClass, runKey(run))
	return err
}

// runKey maps a run's 8 hex digits to the advisory lock's second key.
func runKey(run string) int32 {
	var k uint32
	_, _ = fmt.Sscanf(run, "%08x", &k)
	return int32(k)
}

// newTestDatabase creates a database of this run (newDatabaseName)
// as a copy of template, as CreateDatabase does, and returns its name and
// connection string. The caller drops it (DropDatabase); if the process
// dies first, the next sweep does.
func newTestDatabase(ctx context.Context, admin, template string) (name, dbURL string, err error) {
	if name, err = newDatabaseName(ctx, admin); err != nil {
		return "", "", err
	}
	if dbURL, err = pgadmin.CreateDatabase(ctx, admin, name, template); err != nil {
		return "", "", err
	}
	return name, dbURL, nil
}
