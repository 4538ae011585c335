package pgadmin

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasestore/leasestore/db"
)

// TestingM is what a TestMain runs: *testing.M, or a wrapper of it such
// as the one goleak.VerifyTestMain takes.
type TestingM interface{ Run() int }

// ExampleMain wraps m, the tests of a package whose Example functions work
// in ExamplePool databases: use it as
// goleak.VerifyTestMain(pgadmin.ExampleMain(m)).
//
// Its Run checks the server (TestServerURL) once. When the server cannot
// be reached, or with -short, it adds ^Example to -test.skip, so that the
// examples do not run and the other tests do, and prints one line saying
// why; with CI=true in the environment an unreachable server then fails
// the run, so that CI never passes by skipping. After the tests it drops
// the databases the examples left and closes the run lock's session.
func ExampleMain(m TestingM) TestingM { return exampleMain{m} }

type exampleMain struct{ m TestingM }

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
	admin := TestServerURL()
	var why string
	mustRun := false // the examples must run: fail the run when they cannot
	if f := flag.Lookup("test.short"); f != nil && f.Value.String() == "true" {
		why = "-short skips them"
	} else if err := Ping(admin); err != nil {
		why = fmt.Sprintf("PostgreSQL at %s is not reachable (%s); run scripts/db-start.sh or set TEST_DATABASE_URL",
			Redact(admin), strings.Join(strings.Fields(err.Error()), " "))
		mustRun = os.Getenv("CI") == "true"
	}
	if why == "" {
		examples.mu.Lock()
		examples.admin = admin
		examples.mu.Unlock()
		code := w.m.Run()
		if err := dropExampleDatabases(); err != nil {
			fmt.Fprintf(os.Stderr, "pgadmin: drop the examples' databases: %v\n", err)
			code = max(code, 1)
		}
		ReleaseRun()
		return code
	}
	skip := "^Example"
	if f := flag.Lookup("test.skip"); f != nil && f.Value.String() != "" {
		skip += "|" + f.Value.String()
	}
	if err := flag.Set("test.skip", skip); err != nil {
		fmt.Fprintf(os.Stderr, "pgadmin: skip the examples: %v\n", err)
		return 1
	}
	if !mustRun {
		fmt.Printf("examples skipped: %s\n", why)
		return w.m.Run()
	}
	code := w.m.Run()
	fmt.Fprintf(os.Stderr, "FAIL: examples not run, and CI=true requires them: %s\n", why)
	return max(code, 1)
}

// ExamplePool returns a pool on a new database of this run, migrated with
// db.MigrateUp, for one Example function; the example closes the pool.
// The database is dropped when the next example asks for one, or when
// ExampleMain's Run ends, whichever comes first; if the process dies
// first, the next integration run's sweep drops it. Only call it from
// examples of a package whose TestMain runs ExampleMain.
//
// It panics on any error, which fails the example.
func ExamplePool() *pgxpool.Pool {
	if err := dropExampleDatabases(); err != nil {
		panic(fmt.Sprintf("pgadmin: drop the previous example's database: %v", err))
	}
	examples.mu.Lock()
	defer examples.mu.Unlock()
	if examples.admin == "" {
		panic("pgadmin: ExamplePool needs a TestMain that runs pgadmin.ExampleMain")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	name, dbURL, err := CreateTestDatabase(ctx, examples.admin, "template0")
	if err != nil {
		panic(fmt.Sprintf("pgadmin: create an example database: %v", err))
	}
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		panic(fmt.Sprintf("pgadmin: open a pool on example database %s: %v (drop: %v)", name, err, DropDatabase(examples.admin, name)))
	}
	examples.open = append(examples.open, exampleDB{name: name, pool: pool})
	if _, err := db.MigrateUp(ctx, pool); err != nil {
		panic(fmt.Sprintf("pgadmin: migrate example database %s: %v", name, err))
	}
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
		if err := DropDatabase(examples.admin, d.name); err != nil {
			return fmt.Errorf("drop database %s: %w", d.name, err)
		}
		examples.open = examples.open[1:]
	}
	return nil
}
