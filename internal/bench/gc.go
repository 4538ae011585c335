package bench

import (
	"context"
	"runtime/metrics"

	"github.com/jackc/pgx/v5/pgxpool"
)

// goHeap is what this process's Go runtime has done so far: the garbage
// collections it completed and the bytes it allocated on the heap.
type goHeap struct {
	collections    uint64
	allocatedBytes uint64
}

// readGoHeap reads goHeap from runtime/metrics.
func readGoHeap() goHeap {
	s := []metrics.Sample{{Name: "/gc/cycles/total:gc-cycles"}, {Name: "/gc/heap/allocs:bytes"}}
	metrics.Read(s)
	return goHeap{collections: s[0].Value.Uint64(), allocatedBytes: s[1].Value.Uint64()}
}

// goHeapSince starts measuring this process's heap; the function it
// returns sets d's ClientGCs and ClientBytesPerMessage for the messages
// drained since.
func goHeapSince() func(d *Drain, messages int64) {
	start := readGoHeap()
	return func(d *Drain, messages int64) {
		end := readGoHeap()
		d.ClientGCs = int64(end.collections - start.collections)
		if messages > 0 {
			d.ClientBytesPerMessage = float64(end.allocatedBytes-start.allocatedBytes) / float64(messages)
		}
	}
}

// drainCostsSince starts measuring what a drain that runs in this process
// costs: its CPU time (ProcessCPU), its heap (goHeapSince) and the CPU
// time of the server behind pool (databaseCPUSince). The function it
// returns sets d's ClientCPUSeconds, ClientGCs, ClientBytesPerMessage and
// DatabaseCPUSeconds for the messages drained since.
func drainCostsSince(ctx context.Context, pool *pgxpool.Pool) func(d *Drain, messages int64) {
	dbCPU := databaseCPUSince(ctx, pool)
	heap := goHeapSince()
	cpu0, cpuKnown := ProcessCPU()
	return func(d *Drain, messages int64) {
		if cpu1, _ := ProcessCPU(); cpuKnown {
			d.ClientCPUSeconds = (cpu1 - cpu0).Seconds()
		}
		heap(d, messages)
		d.DatabaseCPUSeconds = dbCPU()
	}
}
