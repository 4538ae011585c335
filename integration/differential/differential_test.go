package differential_test

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/internal/dbtest"
	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/leasingtest"
)

// Differential testing: one random sequence of store calls runs against
// leasing.Memory and leasing.Postgres (both on one manual clock, both given
// the same message ids), and every observable result must agree: errors by
// kind (argument errors by text), returned leases in order with generation,
// attempt and expiry, per-message outcomes, renew results, requeue and purge
// counts, stats, and at the end every row of both queues.
//
// TestDifferential runs fixed seeds (20 × 60 operations; 200 × 300 under
// -stress). FuzzDifferential lets `go test -fuzz` drive the same operations
// from bytes; its corpus in testdata/fuzz/FuzzDifferential holds the seeds
// and every failing input found, as regression cases.

func TestDifferential(t *testing.T) {
	t.Parallel()
	seeds, ops := pick(20, 200), pick(60, 300)
	dbs := &dbtest.RecycledDBs{Owner: t}
	for seed := range seeds {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			t.Parallel()
			pool := newPool(t, dbs.Get(t), "leasestore-differential", 2)
			r := newDiffRun(t, pool, randChooser{rand.New(rand.NewPCG(uint64(seed), 0x5eed))}, uint64(seed))
			r.run(ops)
		})
	}
}

func FuzzDifferential(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte("\x00\x01\x00\x02\x01\x00\x03\x05\x07\x01\x02"))
	pool := newPool(f, freshURL(f), "leasestore-differential", 2)
	f.Fuzz(func(t *testing.T, data []byte) {
		_, err := pool.Exec(context.Background(), emptyQueues)
		require.NoError(t, err)
		r := newDiffRun(t, pool, &byteChooser{data: data}, 0)
		r.run(400)
	})
}

// chooser makes the run's decisions: from a seeded PRNG or from fuzz bytes.
type chooser interface {
	// intn returns a number in [0, n), n >= 1.
	intn(n int) int
	// exhausted reports that a byte-driven run has used up its input.
	exhausted() bool
}

type randChooser struct{ r *rand.Rand }

func (c randChooser) intn(n int) int { return c.r.IntN(n) }
func (randChooser) exhausted() bool  { return false }

type byteChooser struct {
	data []byte
	pos  int
}

func (c *byteChooser) intn(n int) int {
	if n <= 1 || c.pos >= len(c.data) {
		return 0
	}
	b := int(c.data[c.pos])
	c.pos++
	return b % n
}

func (c *byteChooser) exhausted() bool { return c.pos >= len(c.data) }

// leasePair is one claim's lease as each store returned it.
type leasePair struct {
	q        leasing.Queue
	mem, pg  leasing.Lease
	gen      int64
	id       uuid.UUID
	ownerTag string
}

type diffRun struct {
	t     *testing.T
	ctx   context.Context
	c     chooser
	salt  uint64
	seq   uint64
	clock *leasingtest.Clock
	mem   map[leasing.Queue]*leasing.Memory
	pg    map[leasing.Queue]*leasing.Postgres
	known map[leasing.Queue][]uuid.UUID
	isKn  map[leasing.Queue]map[uuid.UUID]bool
	pairs []leasePair
	trace []string
	// seen counts what the run exercised, by result, for the log.
	seen map[string]int
}

func newDiffRun(t *testing.T, pool *pgxpool.Pool, c chooser, salt uint64) *diffRun {
	r := &diffRun{
		t: t, ctx: context.Background(), c: c, salt: salt,
		clock: leasingtest.NewClock(leasingtest.Start),
		mem:   map[leasing.Queue]*leasing.Memory{},
		pg:    map[leasing.Queue]*leasing.Postgres{},
		known: map[leasing.Queue][]uuid.UUID{},
		isKn:  map[leasing.Queue]map[uuid.UUID]bool{},
		seen:  map[string]int{},
	}
	for _, q := range queuesBoth {
		m, err := leasing.NewMemory(q, leasing.MemoryOptions{Now: r.clock.Now})
		require.NoError(t, err)
		p, err := leasing.NewPostgres(pool, q, leasing.PostgresOptions{Now: r.clock.Now})
		require.NoError(t, err)
		r.mem[q], r.pg[q], r.isKn[q] = m, p, map[uuid.UUID]bool{}
	}
	return r
}

// diffOps are the operations and their weights.
var diffOps = []struct {
	name   string
	weight int
	run    func(r *diffRun, q leasing.Queue)
}{
	{"enqueue", 20, (*diffRun).enqueue},
	{"claim", 20, (*diffRun).claim},
	{"renew", 8, (*diffRun).renew},
	{"release", 5, (*diffRun).release},
	{"release-after", 4, (*diffRun).releaseAfter},
	{"complete", 10, (*diffRun).complete},
	{"fail", 8, (*diffRun).fail},
	{"dead-letter", 5, (*diffRun).deadLetter},
	{"requeue", 5, (*diffRun).requeue},
	{"purge", 2, (*diffRun).purge},
	{"advance", 12, (*diffRun).advance},
	{"stats", 2, (*diffRun).stats},
	{"get", 3, (*diffRun).get},
	{"dead-letter-by-id", 3, (*diffRun).deadLetterByID},
	{"strict-ordering", 1, (*diffRun).strictOrdering},
}

func (r *diffRun) run(ops int) {
	total := 0
	for _, op := range diffOps {
		total += op.weight
	}
	for i := 0; i < ops && !r.c.exhausted(); i++ {
		q := queuesBoth[r.c.intn(2)]
		n := r.c.intn(total)
		for _, op := range diffOps {
			if n < op.weight {
				op.run(r, q)
				break
			}
			n -= op.weight
		}
	}
	r.compareAll()
	r.t.Logf("exercised: %v", r.seen)
}

// oneOf returns one of vs, chosen by the run.
func oneOf[T any](r *diffRun, vs ...T) T { return vs[r.c.intn(len(vs))] }

// newID returns the next message id: deterministic from the run's salt, in
// no particular order, so that ties on created_at are broken by id.
func (r *diffRun) newID() uuid.UUID {
	r.seq++
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], r.salt)
	binary.BigEndian.PutUint64(b[8:], r.seq)
	sum := sha256.Sum256(b[:])
	id, _ := uuid.FromBytes(sum[:16])
	return id
}

func (r *diffRun) log(format string, args ...any) {
	r.trace = append(r.trace, fmt.Sprintf("%3d %s: ", len(r.trace), r.clock.Now().Sub(leasingtest.Start))+fmt.Sprintf(format, args...))
}

// same fails the test when mem and pg differ, with the trace so far.
func (r *diffRun) same(what string, mem, pg any) {
	r.t.Helper()
	if fmt.Sprint(mem) == fmt.Sprint(pg) {
		return
	}
	r.t.Fatalf("differential mismatch in %s\nmemory:   %v\npostgres: %v\ntrace (clock offset from leasingtest.Start):\n%s",
		what, mem, pg, strings.Join(r.trace, "\n"))
}

func (r *diffRun) remember(q leasing.Queue, ids ...uuid.UUID) {
	for _, id := range ids {
		if !r.isKn[q][id] {
			r.isKn[q][id] = true
			r.known[q] = append(r.known[q], id)
		}
	}
}
