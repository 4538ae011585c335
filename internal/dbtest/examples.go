package dbtest

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasestore/leasestore/internal/pgadmin"
)

// ExampleMain wraps m, the tests of a package whose Example functions work
// in ExamplePool databases, as Main does: use it as
// goleak.VerifyTestMain(dbtest.ExampleMain(m)).
//
// Its Run checks the server (serverURL) once. When the server cannot
// be reached, or with -short, it adds ^Example to -test.skip, so that the
// examples do not run and the other tests do, and prints one line saying
// why; with CI=true in the environment an unreachable server then fails
// the run, so that CI never passes by skipping. After the tests it drops
// the databases the examples left, then, as Main does, whatever else the
// run left. Unlike Main it installs no interrupt handler: an example may
// signal its own process (a graceful shutdown on SIGINT); an interrupted
// run's objects go to the next run's sweep.
func ExampleMain(m M) M { return exampleMain{m} }

type exampleMain struct{ m M }

// examples holds the server and the databases of ExamplePool.
var examples struct {
	mu    sync.Mutex
	admin string
	open  []exampleDB
}

type exampleDB struct {
	name string
	pool *pgxpool.Pool
}

// Run runs the tests and examples, or the tests alone when the examples
// cannot run, then drops the examples' databases.
func (w exampleMain) Run() int {
	if !flag.Parsed() {
		flag.Parse()
	}
	admin := serverURL()
	var why string
	mustRun := false // the examples must run: fail the run when they cannot
	if f := flag.Lookup("test.short"); f != nil && f.Value.String() == "true" {
		why = "-short skips them"
	} else if err := pgadmin.Ping(admin); err != nil {
		why = fmt.Sprintf("PostgreSQL at %s is not reachable (%s); run scripts/db-start.sh or set TEST_DATABASE_URL",
			pgadmin.Redact(admin), strings.Join(strings.Fields(err.Error()), " "))
		mustRun = os.Getenv("CI") == "true"
	}
	if why == "" {
		examples.mu.Lock()
		examples.admin = admin
		examples.mu.Unlock()
		code := w.m.Run()
		if err := dropExampleDatabases(); err != nil {
			fmt.Fprintf(os.Stderr, "dbtest: drop the examples' databases: %v\n", err)
			code = max(code, 1)
		}
		return endRun(code)
	}
	skip := "^Example"
	if f := flag.Lookup("test.skip"); f != nil && f.Value.String() != "" {
		skip += "|" + f.Value.String()
	}
	if err := flag.Set("test.skip", skip); err != nil {
		fmt.Fprintf(os.Stderr, "dbtest: skip the examples: %v\n", err)
		return 1
	}
	if !mustRun {
		fmt.Printf("examples skipped: %s\n", why)
		return endRun(w.m.Run())
	}
	code := endRun(w.m.Run())
	fmt.Fprintf(os.Stderr, "FAIL: examples not run, and CI=true requires them: %s\n", why)
	return max(code, 1)
}

// ExamplePool returns a pool on a new database of this run, cloned from
// the migrated template as DatabaseURL's are, for one Example function; the example closes the pool.
// The database is dropped when the next example asks for one, or when
// ExampleMain's Run ends, whichever comes first; if the process dies
// first, the next run's sweep drops it. Only call it from
// examples of a package whose TestMain runs ExampleMain.
//
// It panics on any error, which fails the example.
func ExamplePool() *pgxpool.Pool {
	if err := dropExampleDatabases(); err != nil {
		panic(fmt.Sprintf("dbtest: drop the previous example's database: %v", err))
	}
	examples.mu.Lock()
	defer examples.mu.Unlock()
	if examples.admin == "" {
		panic("dbtest: ExamplePool needs a TestMain that runs dbtest.ExampleMain")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tpl, err := ensureTemplate(ctx, examples.admin)
	if err != nil {
		panic(fmt.Sprintf("dbtest: build the template database: %v", err))
	}
	name, dbURL, err := newTestDatabase(ctx, examples.admin, tpl)
	if err != nil {
		panic(fmt.Sprintf("dbtest: create an example database: %v", err))
	}
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		panic(fmt.Sprintf("dbtest: open a pool on example database %s: %v (drop: %v)", name, err, pgadmin.DropDatabase(examples.admin, name)))
	}
	examples.open = append(examples.open, exampleDB{name: name, pool: pool})
	return pool
}

// dropExampleDatabases closes the pools of the earlier examples (a no-op
// when the example closed its own) and drops their databases.
func dropExampleDatabases() error {
	examples.mu.Lock()
	defer examples.mu.Unlock()
	for len(examples.open) > 0 {
		d := examples.open[0]
		d.pool.Close()
		if err := pgadmin.DropDatabase(examples.admin, d.name); err != nil {
			return fmt.Errorf("drop database %s: %w", d.name, err)
		}
		examples.open = examples.open[1:]
	}
	return nil
}
