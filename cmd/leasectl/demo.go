package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasestore/leasestore/db"
	"github.com/leasestore/leasestore/leasing"
)

// errDemoFailed is returned when a demo check fails; the details are printed.
var errDemoFailed = errors.New("demo checks failed (see FAIL lines above)")

// demoLease is the lease duration the demo workers claim with.
const demoLease = 30 * time.Second

// runDemo is "leasectl demo": the seed's concrete example. Two processor
// instances start at the same moment with batch size 10; PostgreSQL skips
// the rows the other holds locked, so each gets a separate subset.
func runDemo(ctx context.Context, c *cli, args []string) error {
	fs := c.newFlagSet("demo", "[--keep] [--messages N] [--batch N] [--throwaway auto|always|never]\n\n"+
		"Creates its own database leasestore_demo_<random> on the server (it never\n"+
		"touches other databases), migrates it, enqueues messages on the inbox and the\n"+
		"outbox, starts two processor instances at the same moment, checks that their\n"+
		"claimed subsets are disjoint and that every message finished, prints queue\n"+
		"depth by status and drops the database.")
	keep := fs.Bool("keep", false, "keep the demo database instead of dropping it")
	messages := fs.Int("messages", 100, "messages to enqueue on each queue")
	batch := fs.Int("batch", 10, "claim batch size of each processor instance")
	handleTime := fs.Duration("handle-time", time.Millisecond, "simulated handling time per message")
	throwaway := fs.String("throwaway", "auto", "start a throwaway PostgreSQL from the installed server binaries:\n"+
		"auto: when none answers at the default URL; always; never")
	if err := c.parse(fs, args); err != nil {
		return err
	}
	switch {
	case *messages < 1 || *messages > 1_000_000:
		return usagef("--messages must be 1..1000000, got %d", *messages)
	case *batch < 1 || *batch > leasing.MaxBatchSize:
		return usagef("--batch must be 1..%d, got %d", leasing.MaxBatchSize, *batch)
	case *handleTime < 0 || *handleTime > time.Second:
		return usagef("--handle-time must be 0..1s, got %s", *handleTime)
	case *throwaway != "auto" && *throwaway != "always" && *throwaway != "never":
		return usagef("--throwaway must be auto, always or never, got %q", *throwaway)
	}
	if _, err := c.poolConfig(); err != nil {
		return err
	}

	out := c.stdout
	fmt.Fprintln(out, "leasectl demo: two processor instances claim from the same queues at the same moment")
	server, err := c.demoServer(ctx, *throwaway)
	if err != nil {
		return err
	}
	defer server.stop()
	admin := server.url
	keepDB := *keep && !server.throwaway
	if *keep && server.throwaway {
		fmt.Fprintln(out, "note: --keep has no effect on a throwaway server, which is removed at exit")
	}

	name := "leasestore_demo_" + randomHex(6)
	demoURL, err := createDemoDatabase(ctx, admin, name)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "created database %s\n", name)
	defer func() {
		if keepDB {
			fmt.Fprintf(out, "kept database %s; look at it with:\n  leasectl --database-url '%s' stats\n", name, demoURL)
			return
		}
		if err := dropDemoDatabase(admin, name); err != nil {
			fmt.Fprintf(c.stderr, "leasectl demo: drop database %s: %v\n", name, err)
			return
		}
		fmt.Fprintf(out, "dropped database %s\n", name)
	}()

	cfg, err := pgxpool.ParseConfig(demoURL)
	if err != nil {
		return err
	}
	cfg.MaxConns = 8
	cfg.ConnConfig.RuntimeParams["application_name"] = "leasectl demo"
	pool, err := openPool(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	versions, err := db.MigrateUp(ctx, pool)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "migrated: %d migrations applied\n", len(versions))
	return demoRun(ctx, out, pool, *messages, *batch, *handleTime)
}

// createDemoDatabase creates database name through the admin connection
// string and returns the connection string of the new database.
func createDemoDatabase(ctx context.Context, admin, name string) (string, error) {
	demoURL, err := withDatabase(admin, name)
	if err != nil {
		return "", err
	}
	if err := adminExec(ctx, admin, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return "", fmt.Errorf("create the demo database (the role needs the CREATEDB privilege): %w", err)
	}
	return demoURL, nil
}

// dropDemoDatabase drops database name, closing its connections. It runs
// on its own context so that it also cleans up after an interrupt.
func dropDemoDatabase(admin, name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return adminExec(ctx, admin, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
}

// adminExec runs one statement on a new connection to the admin database.
func adminExec(ctx context.Context, admin, sql string) error {
	ctx, cancel := context.WithTimeout(ctx, connectTimeout+20*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, sql)
	return err
}

// demoInstance is one processor instance: an owner with one worker per queue.
type demoInstance struct {
	label string
	owner string
}

// demoRun enqueues messages on both queues of the migrated database behind
// pool, runs the two instances and checks and prints the result.
func demoRun(ctx context.Context, out io.Writer, pool *pgxpool.Pool, messages, batch int, handleTime time.Duration) error {
	queues := []leasing.Queue{leasing.Inbox, leasing.Outbox}
	stores := map[leasing.Queue]*leasing.Postgres{}
	enqueued := map[leasing.Queue][]uuid.UUID{}
	for _, q := range queues {
		store, err := newStore(pool, q)
		if err != nil {
			return err
		}
		stores[q] = store
		ids, err := enqueueMany(ctx, store, messages, func(i int) leasing.NewMessage {
			m := leasing.NewMessage{Type: "demo.order_placed", Payload: fmt.Appendf(nil, `{"order":%d}`, i+1)}
			if q == leasing.Outbox {
				m.Type, m.Topic = "demo.order_confirmed", "orders"
			}
			return m
		})
		if err != nil {
			return err
		}
		enqueued[q] = ids
	}
	fmt.Fprintf(out, "enqueued %d inbox and %d outbox messages\n", len(enqueued[leasing.Inbox]), len(enqueued[leasing.Outbox]))

	instances := []demoInstance{
		{label: "A", owner: leasing.NewOwner("demo-a")},
		{label: "B", owner: leasing.NewOwner("demo-b")},
	}
	// Open the connections up front so that neither instance starts late
	// because it waited for a new connection.
	if err := warmPool(ctx, pool, len(instances)*len(queues)); err != nil {
		return err
	}

	type job struct {
		queue    leasing.Queue
		instance demoInstance
		result   demoWorkerResult
		err      error
	}
	jobs := make([]*job, 0, len(instances)*len(queues))
	for _, q := range queues {
		for _, in := range instances {
			jobs = append(jobs, &job{queue: q, instance: in})
		}
	}
	fmt.Fprintf(out, "starting %d processor instances at the same moment, batch size %d, lease %s:\n", len(instances), batch, demoLease)
	for _, in := range instances {
		fmt.Fprintf(out, "  instance %s: owner %s, one worker on the inbox and one on the outbox\n", in.label, in.owner)
	}

	// Barrier: every worker goroutine is parked on start before it opens.
	start := make(chan struct{})
	var ready, done sync.WaitGroup
	for _, j := range jobs {
		ready.Add(1)
		done.Add(1)
		go func() {
			defer done.Done()
			ready.Done()
			<-start
			j.result, j.err = runDemoWorker(ctx, demoWorker{
				Store: stores[j.queue], Owner: j.instance.owner, BatchSize: batch,
				LeaseFor: demoLease, HandleTime: handleTime,
			})
		}()
	}
	ready.Wait()
	began := time.Now()
	close(start)
	done.Wait()
	if err := ctx.Err(); err != nil {
		return err
	}
	fmt.Fprintf(out, "all workers finished in %s\n", time.Since(began).Round(time.Millisecond))

	ok := true
	for _, q := range queues {
		fmt.Fprintf(out, "\n%s (%d messages)\n", q, len(enqueued[q]))
		claimedBy := map[uuid.UUID]int{}
		for _, j := range jobs {
			if j.queue != q {
				continue
			}
			r := j.result
			fmt.Fprintf(out, "  instance %s claimed %3d in %2d batches: %s\n", j.instance.label, len(r.Claimed), r.Batches, joinIDs(r.Claimed, 3))
			if j.err != nil {
				fmt.Fprintf(out, "  FAIL: instance %s stopped with an error: %v\n", j.instance.label, j.err)
				ok = false
			}
			for _, id := range r.Claimed {
				claimedBy[id]++
			}
		}
		var twice, missing []uuid.UUID
		for id, n := range claimedBy {
			if n > 1 {
				twice = append(twice, id)
			}
		}
		for _, id := range enqueued[q] {
			if claimedBy[id] == 0 {
				missing = append(missing, id)
			}
		}
		if len(twice) == 0 {
			fmt.Fprintf(out, "  disjoint: yes, no message was claimed twice (%d distinct messages claimed)\n", len(claimedBy))
		} else {
			slices.SortFunc(twice, func(a, b uuid.UUID) int { return slices.Compare(a[:], b[:]) })
			fmt.Fprintf(out, "  FAIL: not disjoint: %d messages claimed more than once: %s\n", len(twice), joinIDs(twice, 5))
			ok = false
		}
		if len(missing) > 0 {
			fmt.Fprintf(out, "  FAIL: %d messages were never claimed: %s\n", len(missing), joinIDs(missing, 5))
			ok = false
		}
		finished, notFinished, err := countFinished(ctx, stores[q], enqueued[q])
		if err != nil {
			return err
		}
		if len(notFinished) == 0 {
			fmt.Fprintf(out, "  every message ended %s: %d of %d\n", q.Succeeded(), finished, len(enqueued[q]))
		} else {
			fmt.Fprintf(out, "  FAIL: %d of %d messages ended %s; not: %s\n", finished, len(enqueued[q]), q.Succeeded(), joinIDs(notFinished, 5))
			ok = false
		}
	}

	fmt.Fprintln(out, "\nqueue depth by status")
	all, err := queueStats(ctx, pool, queues)
	if err != nil {
		return err
	}
	if err := printStats(out, all); err != nil {
		return err
	}
	if !ok {
		return errDemoFailed
	}
	fmt.Fprintln(out, "\nPASS: the instances claimed disjoint subsets and every message ended completed/published")
	return nil
}

// warmPool opens n connections in pool and puts them back.
func warmPool(ctx context.Context, pool *pgxpool.Pool, n int) error {
	conns := make([]*pgxpool.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	for range n {
		c, err := pool.Acquire(ctx)
		if err != nil {
			return err
		}
		conns = append(conns, c)
	}
	return nil
}

// countFinished returns how many of ids are in the queue's success state
// (completed or published), and the ids that are not.
func countFinished(ctx context.Context, store *leasing.Postgres, ids []uuid.UUID) (int, []uuid.UUID, error) {
	status := make(map[uuid.UUID]leasing.Status, len(ids))
	var after time.Time
	afterID := uuid.Nil
	for {
		rows, err := store.List(ctx, after, afterID, leasing.MaxBatchSize)
		if err != nil {
			return 0, nil, err
		}
		for _, r := range rows {
			status[r.ID] = r.Status
		}
		if len(rows) < leasing.MaxBatchSize {
			break
		}
		last := rows[len(rows)-1]
		after, afterID = last.CreatedAt, last.ID
	}
	finished := 0
	var not []uuid.UUID
	for _, id := range ids {
		if status[id] == store.Queue().Succeeded() {
			finished++
		} else {
			not = append(not, id)
		}
	}
	return finished, not, nil
}

// demoWorker configures one processor instance's worker on one queue.
type demoWorker struct {
	Store      leasing.Store
	Owner      string
	BatchSize  int
	LeaseFor   time.Duration
	HandleTime time.Duration
}

// demoWorkerResult is what one demo worker did.
type demoWorkerResult struct {
	// Claimed holds every message id the worker claimed, in claim order.
	Claimed []uuid.UUID
	// Batches counts the claims that returned at least one lease.
	Batches int
	// Completed counts the messages whose success state the worker wrote.
	Completed int
}

// runDemoWorker is one processor instance's loop over one queue: claim a
// batch, handle each message (record its id, take HandleTime), complete the
// batch under its leases, and stop when a claim finds nothing due. Leases
// are short-lived enough here (HandleTime × BatchSize ≪ LeaseFor) that the
// loop does not renew them.
func runDemoWorker(ctx context.Context, w demoWorker) (demoWorkerResult, error) {
	var res demoWorkerResult
	req := leasing.ClaimRequest{Owner: w.Owner, BatchSize: w.BatchSize, LeaseFor: w.LeaseFor}
	for {
		leases, err := w.Store.Claim(ctx, req)
		if err != nil {
			return res, err
		}
		if len(leases) == 0 {
			return res, nil
		}
		res.Batches++
		for _, l := range leases {
			res.Claimed = append(res.Claimed, l.Message.ID)
			if err := sleepCtx(ctx, w.HandleTime); err != nil {
				return res, err
			}
		}
		written, err := w.Store.Complete(ctx, leases...)
		if err != nil {
			return res, err
		}
		res.Completed += written.Count(leasing.OutcomeApplied) + written.Count(leasing.OutcomeAlreadyApplied)
		if err := written.Err(); err != nil {
			return res, err
		}
	}
}
