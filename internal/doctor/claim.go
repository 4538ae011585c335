package doctor

import (
	"context"
	"fmt"
	"slices"

	"github.com/leasestore/leasestore/internal/explain"
	"github.com/leasestore/leasestore/leasing"
)

// smallTable is the row count below which a sequential scan or a sort in
// the claim plan is only a warning.
const smallTable = 10_000

// checkClaim explains a real claim of opts.BatchSize on store's queue
// (rolled back), custom and generic plan, fills qr's plan fields and
// reports, through n, a plan whose cost grows with the table or the
// backlog. rows is the table's row count: below smallTable a sequential
// scan or sort is the planner's right choice, only a warning. It needs
// every migration the claim reads.
func checkClaim(ctx context.Context, store *leasing.Postgres, q leasing.Queue, opts Options, rows int64, qr *QueueReport, n notes) error {
	t := q.Table()
	plan, err := explain.Claim(ctx, store.Pool(), q, opts.BatchSize, explain.Options{})
	if err != nil {
		return fmt.Errorf("doctor: %w", err)
	}
	qr.ClaimPlan, qr.ClaimIndexes, qr.ClaimBatch = plan.Nodes, plan.Indexes, opts.BatchSize
	qr.ClaimRows, qr.ClaimBuffers, qr.ClaimMs = plan.Rows, plan.Buffers, float64(plan.Duration.Microseconds())/1000
	qr.SeqScan, qr.SortOverEligible, qr.TempBlocks = plan.SeqScan, plan.SortOverEligible, plan.TempBlocks
	// On a small table a sequential scan or a sort is the planner's
	// cheapest choice, not a fault; it switches as the table grows. The
	// expiry probe reads one row at most, so a small table may answer it
	// with a sequential scan too.
	small := rows < smallTable
	unlessSmall := func(msg string) {
		if small {
			n.warn(msgSmallTable, msg, rows)
		} else {
			n.problem("%s", msg)
		}
	}
	used := []string{t + "_ready_idx", t + "_inflight_idx"}
	if !small {
		used = append(used, t+"_expiry_idx")
	}
	for _, name := range used {
		if !slices.Contains(plan.Indexes, name) {
			n.problem(msgClaimIndexUnused, name)
		}
	}
	if plan.SeqScan {
		unlessSmall(fmt.Sprintf(msgClaimSeqScan, t))
	}
	if plan.SortOverEligible {
		unlessSmall(msgClaimSorts)
	}
	if plan.TempBlocks > 0 {
		n.problem(msgClaimSpilled, plan.TempBlocks)
	}
	generic, err := explain.ClaimGeneric(ctx, store.Pool(), q, opts.BatchSize, explain.Options{})
	if err != nil {
		return fmt.Errorf("doctor: %w", err)
	}
	qr.GenericClaimBuffers, qr.GenericSeqScan, qr.GenericSortOverEligible = generic.Buffers, generic.SeqScan, generic.SortOverEligible
	qr.JIT = generic.JIT
	if generic.JIT {
		n.problem(msgClaimJIT)
	}
	if !small && (generic.SeqScan || generic.SortOverEligible) {
		n.problem(msgGenericPlan, generic.Buffers, t)
	}
	if plan.Buffers > opts.MaxClaimBuffers {
		n.problem(msgClaimBuffers, opts.BatchSize, plan.Buffers, opts.MaxClaimBuffers)
	}
	return nil
}
