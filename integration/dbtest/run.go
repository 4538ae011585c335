package dbtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"regexp"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/leasestore/leasestore/internal/pgadmin"
)

// DatabasePrefix starts the name of every test database; RolePrefix the
// name of every per-test role. The rest of the name is
// <run>_<random>, <run> being 8 hex digits that identify the test process.
const (
	DatabasePrefix = "leasestore_test_"
	RolePrefix     = "leasestore_t_"
)

// runLockClass is the first key of the two-key session advisory lock that
// a live run holds on the maintenance database; the second is the run.
const runLockClass int32 = 0x6c736474 // "lsdt"

// cleanupTimeout bounds a sweep or a run's drop on an interrupt.
const cleanupTimeout = time.Minute

var (
	// runID identifies this process's databases and roles.
	runID = randomHex(4)

	runMu     sync.Mutex
	runHolder *pgx.Conn // holds the run's advisory lock; nil until first used
	runAdmin  string    // the maintenance database runHolder is on
)

var (
	databaseName = regexp.MustCompile(`^` + DatabasePrefix + `([0-9a-f]{8})_[0-9a-f]+$`)
	roleName     = regexp.MustCompile(`^` + RolePrefix + `([0-9a-f]{8})_[0-9a-f]+$`)
)

// RunID returns the 8 hex digits that name this process's databases and
// roles.
func RunID() string { return runID }

// RoleName returns a new role name for this run, leasestore_t_<run>_<random>,
// so that a sweep drops the role when the run dies before its cleanup. The
// caller creates the role and drops it in tb.Cleanup; if it owns objects,
// the cleanup hands them back first (a sweep drops the run's databases
// before its roles, so objects in test databases do not keep a role alive).
func RoleName(tb testing.TB) string {
	tb.Helper()
	if err := holdRun(tb.Context(), URL(tb)); err != nil {
		tb.Fatalf("dbtest: %v", err)
	}
	return RolePrefix + runID + "_" + randomHex(6)
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

// releaseRun closes the run lock's session, if any.
func releaseRun() {
	runMu.Lock()
	defer runMu.Unlock()
	if runHolder != nil {
		_ = runHolder.Close(context.Background())
		runHolder = nil
	}
}

// runKey maps a run's 8 hex digits to the advisory lock's second key.
func runKey(run string) int32 {
	var k uint32
	_, _ = fmt.Sscanf(run, "%08x", &k)
	return int32(k)
}

// Sweep drops the test databases and per-test roles of every run on the
// server at admin whose process is gone, that is, whose run lock it can
// take. It holds that lock while dropping, so that a run whose session the
// server lost waits for the sweep before it creates anything new. It never
// touches this process's objects, nor names it does not recognise.
//
// Errors: the server's, joined; a sweep that fails leaves the rest for
// the next.
func Sweep(admin string) error {
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	byRun, err := leftovers(ctx, conn)
	if err != nil {
		return err
	}
	var errs []error
	for run, objs := range byRun {
		if run == runID {
			continue
		}
		var dead bool
		if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1, $2)", runLockClass, runKey(run)).Scan(&dead); err != nil {
			return errors.Join(append(errs, err)...)
		}
		if !dead {
			continue
		}
		errs = append(errs, dropObjects(ctx, admin, objs))
		if _, err := conn.Exec(ctx, "SELECT pg_advisory_unlock($1, $2)", runLockClass, runKey(run)); err != nil {
			return errors.Join(append(errs, err)...)
		}
	}
	return errors.Join(errs...)
}

// dropRun drops every database and role of this run that is still there.
func dropRun(admin string) error {
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		return err
	}
	byRun, err := leftovers(ctx, conn)
	_ = conn.Close(context.Background())
	if err != nil {
		return err
	}
	return dropObjects(ctx, admin, byRun[runID])
}

// runObjects are one run's databases and roles.
type runObjects struct{ databases, roles []string }

// leftovers lists the test databases and per-test roles on conn's server
// by run.
func leftovers(ctx context.Context, conn *pgx.Conn) (map[string]*runObjects, error) {
	byRun := map[string]*runObjects{}
	get := func(run string) *runObjects {
		if byRun[run] == nil {
			byRun[run] = &runObjects{}
		}
		return byRun[run]
	}
	rows, err := conn.Query(ctx, "SELECT datname FROM pg_database WHERE starts_with(datname, $1) ORDER BY datname", DatabasePrefix)
	if err != nil {
		return nil, err
	}
	dbs, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, err
	}
	for _, name := range dbs {
		if m := databaseName.FindStringSubmatch(name); m != nil {
			get(m[1]).databases = append(get(m[1]).databases, name)
		}
	}
	rows, err = conn.Query(ctx, "SELECT rolname FROM pg_roles WHERE starts_with(rolname, $1) ORDER BY rolname", RolePrefix)
	if err != nil {
		return nil, err
	}
	roles, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, err
	}
	for _, name := range roles {
		if m := roleName.FindStringSubmatch(name); m != nil {
			get(m[1]).roles = append(get(m[1]).roles, name)
		}
	}
	return byRun, nil
}

// dropObjects drops objs' databases, then its roles: a role that owns
// objects only in those databases can go once they are gone.
func dropObjects(ctx context.Context, admin string, objs *runObjects) error {
	if objs == nil {
		return nil
	}
	var errs []error
	for _, name := range objs.databases {
		errs = append(errs, pgadmin.DropDatabase(admin, name))
	}
	for _, name := range objs.roles {
		errs = append(errs, pgadmin.Exec(ctx, admin, "DROP ROLE IF EXISTS "+ident(name)))
	}
	return errors.Join(errs...)
}

// M is what a TestMain runs: testing.M, or a wrapper of it such as the
// one goleak.VerifyTestMain takes.
type M interface{ Run() int }

// Main wraps m so that its Run drops this run's databases and roles when the
// process receives SIGINT or SIGTERM (and then dies of the signal as it
// would have), and after the tests, whatever their cleanups left. Use it
// as goleak.VerifyTestMain(dbtest.Main(m)), or os.Exit(dbtest.Main(m).Run()).
//
// A panic or go test -timeout ends the process without either; the next
// run's Sweep drops what it left.
func Main(m M) M { return mainM{m} }

type mainM struct{ m M }

// Run runs the tests with the interrupt handler installed, stops the
// handler's goroutine and drops the run's leftovers.
func (w mainM) Run() int {
	sigs := make(chan os.Signal, 1)
	done := make(chan struct{})
	stopped := make(chan struct{})
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go func() {
		defer close(stopped)
		select {
		case sig := <-sigs:
			runMu.Lock()
			admin := runAdmin
			runMu.Unlock()
			if admin != "" {
				if err := dropRun(admin); err != nil {
					fmt.Fprintf(os.Stderr, "dbtest: drop this run's databases and roles on %v: %v\n", sig, err)
				}
			}
			signal.Reset(os.Interrupt, syscall.SIGTERM)
			if p, err := os.FindProcess(os.Getpid()); err == nil {
				_ = p.Signal(sig)
			}
			// The signal ends the process, unless the process ignores it.
			time.Sleep(time.Second)
			os.Exit(1)
		case <-done:
		}
	}()
	code := w.m.Run()
	signal.Stop(sigs)
	close(done)
	<-stopped
	runMu.Lock()
	admin := runAdmin
	runMu.Unlock()
	if admin != "" {
		if err := dropRun(admin); err != nil {
			fmt.Fprintf(os.Stderr, "dbtest: drop this run's leftovers: %v\n", err)
			if code == 0 {
				code = 1
			}
		}
	}
	releaseRun()
	return code
}
