package dbtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/leasestore/leasestore/internal/pgadmin"
)

// cleanupTimeout bounds a sweep or a run's drop on an interrupt.
const cleanupTimeout = time.Minute

// RoleName returns a new role name for this run, leasestore_t_<run>_<random>,
// so that a sweep drops the role when the run dies before its cleanup. The
// caller creates the role and drops it in tb.Cleanup; if it owns objects,
// the cleanup hands them back first (a sweep drops the run's databases
// before its roles, so objects in test databases do not keep a role alive).
func RoleName(tb testing.TB) string {
	tb.Helper()
	name, err := newRoleName(tb.Context(), URL(tb))
	if err != nil {
		tb.Fatalf("dbtest: %v", err)
	}
	return name
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
		if run == RunID() {
			continue
		}
		dead, err := tryLockRun(ctx, conn, run)
		if err != nil {
			return errors.Join(append(errs, err)...)
		}
		if !dead {
			continue
		}
		errs = append(errs, dropObjects(ctx, admin, objs))
		if err := unlockRun(ctx, conn, run); err != nil {
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
	return dropObjects(ctx, admin, byRun[RunID()])
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
		if run, ok := databaseRun(name); ok {
			get(run).databases = append(get(run).databases, name)
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
		if run, ok := roleRun(name); ok {
			get(run).roles = append(get(run).roles, name)
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
			if admin := runAdminURL(); admin != "" {
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
	return endRun(code)
}

// endRun drops the run's leftovers, closes the run lock's session and
// returns code, or 1 when the drop failed after passing tests.
func endRun(code int) int {
	stopPgBouncer()
	if admin := runAdminURL(); admin != "" {
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
