package bench

import (
	"fmt"
	"io"
	"strings"
)

// writeText writes res as a report for people.
func writeText(w io.Writer, res Result, dbURL string) error {
	var b strings.Builder
	fmt.Fprintf(&b, "queue %s: %d due, %d terminal, %d deferred, %d expired leases; filled in %.1f s\n",
		res.Queue, res.Messages, res.TerminalRows, res.DeferredRows, res.ExpiredLeases, res.FillSeconds)
	c := res.Clean
	fmt.Fprintf(&b, "claim of %d on the filled table: %d buffers, %.3f ms, %d rows", res.ExplainBatch, c.Buffers, c.Ms, c.Rows)
	fmt.Fprintf(&b, "; seq scan %t, sort over eligible rows %t, temp blocks %d, JIT %t\n", c.SeqScan, c.SortOverEligible, c.TempBlocks, c.JIT)
	for _, n := range c.Plan {
		fmt.Fprintf(&b, "  %s\n", n)
	}
	g := res.CleanGeneric
	fmt.Fprintf(&b, "generic plan of the same claim: %d buffers, %.3f ms; seq scan %t, sort over eligible rows %t\n", g.Buffers, g.Ms, g.SeqScan, g.SortOverEligible)
	if tc, tg := res.Topic, res.TopicGeneric; tc != nil && tg != nil {
		fmt.Fprintf(&b, "claim of %d for one topic (%d due rows of it behind the %d of other topics): %d buffers (%.2fx the unscoped), %.3f ms, %d rows; generic plan %d buffers (%.2fx); seq scan %t, sort over eligible rows %t\n",
			res.ExplainBatch, res.TopicRows, res.Messages, tc.Buffers, ratio(tc.Buffers, c.Buffers), tc.Ms, tc.Rows,
			tg.Buffers, ratio(tg.Buffers, g.Buffers), tc.SeqScan || tg.SeqScan, tc.SortOverEligible || tg.SortOverEligible)
	}
	if res.Sampled != nil {
		fmt.Fprintf(&b, "drain with claim-cost samples (they pause its workers, so it is not compared with pgbench)\n")
		writeDrain(&b, res, res.Sampled)
	}
	for i, r := range res.Rounds {
		switch {
		case len(res.Rounds) > 1:
			fmt.Fprintf(&b, "round %d of %d\n", i+1, len(res.Rounds))
		case res.Sampled != nil:
			fmt.Fprintf(&b, "drains compared, without samples\n")
		}
		writeDrain(&b, res, r.API)
		if r.Raw != nil {
			writeDrain(&b, res, r.Raw)
		}
		if r.Processor != nil {
			writeDrain(&b, res, r.Processor)
		}
		if r.Keyed != nil {
			writeDrain(&b, res, r.Keyed)
		}
	}
	if res.KeyedVsUnkeyed > 0 {
		ratios := make([]string, 0, len(res.Rounds))
		for _, r := range res.Rounds {
			ratios = append(ratios, fmt.Sprintf("%.2f", r.KeyedVsUnkeyed))
		}
		fmt.Fprintf(&b, "keyed (%d ordering keys) / unkeyed: %.2f, the median of %d rounds (%s)\n",
			res.OrderingKeys, res.KeyedVsUnkeyed, len(res.Rounds), strings.Join(ratios, ", "))
	}
	if res.APIVsRaw > 0 {
		if len(res.Rounds) > 1 {
			ratios := make([]string, 0, len(res.Rounds))
			for _, r := range res.Rounds {
				ratios = append(ratios, fmt.Sprintf("%.2f", r.APIVsRaw))
			}
			fmt.Fprintf(&b, "leasing / pgbench: %.2f, the median of %d rounds (%s)\n", res.APIVsRaw, len(res.Rounds), strings.Join(ratios, ", "))
		} else {
			fmt.Fprintf(&b, "leasing / pgbench: %.2f\n", res.APIVsRaw)
		}
	}
	if res.ProcessorVsRaw > 0 {
		ratios := make([]string, 0, len(res.Rounds))
		for _, r := range res.Rounds {
			ratios = append(ratios, fmt.Sprintf("%.2f", r.ProcessorVsRaw))
		}
		fmt.Fprintf(&b, "processor / pgbench: %.2f, the median of %d rounds (%s)\n", res.ProcessorVsRaw, len(res.Rounds), strings.Join(ratios, ", "))
	}
	if res.RawSkipped != "" {
		fmt.Fprintf(&b, "pgbench baseline skipped: %s\n", res.RawSkipped)
	}
	if s := res.Steady; s != nil {
		fmt.Fprintf(&b, "claim of %d during the drain, %d samples: workers held, buffers p50 %d max %d (%.1fx clean %d); live, buffers p50 %d max %d (%.1fx)\n",
			res.ExplainBatch, len(s.Samples), s.P50Buffers, s.MaxBuffers, s.MaxRatio, s.CleanBuffers, s.LiveP50Buffers, s.LiveMaxBuffers, s.LiveMaxRatio)
	}
	if res.Kept {
		fmt.Fprintf(&b, "database kept: %s\n", dbURL)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// writeDrain writes drain d of res: its rate, its latencies and whether it
// verified.
func writeDrain(b *strings.Builder, res Result, d *Drain) {
	fmt.Fprintf(b, "%-8s drained %d in %.2f s: %.0f messages/s, %d workers, batch %d", d.Method, res.Drained, d.Seconds, d.MessagesPerSecond, res.Workers, res.BatchSize)
	if d.Method != "processor" { // the processors' claims are not counted
		fmt.Fprintf(b, ", %d claims (%d empty)", d.Claims, d.EmptyClaims)
	}
	fmt.Fprintf(b, ", %d VACUUMs, %d autovacuums", d.Vacuums, d.Autovacuums)
	if d.Method == "keyed" {
		fmt.Fprintf(b, ", %d VACUUMs of the keys' table", d.KeyVacuums)
	}
	if d.Method == "leasing" || d.Method == "keyed" {
		if d.RoundTrips == 1 {
			fmt.Fprintf(b, "\n         one round trip per batch: complete-and-claim p50 %.3f ms p99 %.3f ms", d.CompleteAndClaimP50Ms, d.CompleteAndClaimP99Ms)
		} else {
			fmt.Fprintf(b, "\n         two round trips per batch: claim p50 %.3f ms p99 %.3f ms; complete p50 %.3f ms p99 %.3f ms", d.ClaimP50Ms, d.ClaimP99Ms, d.CompleteP50Ms, d.CompleteP99Ms)
		}
	} else if d.Method == "processor" {
		fmt.Fprintf(b, "\n         %d processors, Concurrency %d each, no-op handler", res.Workers, res.BatchSize)
		if res.MergedCompletions {
			b.WriteString(", completions merged with claims")
		}
	} else {
		fmt.Fprintf(b, "\n         claim + complete loop average %.3f ms", d.LoopAvgMs)
	}
	if d.ClientCPUSeconds > 0 {
		fmt.Fprintf(b, "; client CPU %.2f s", d.ClientCPUSeconds)
	}
	if d.ClientBytesPerMessage > 0 {
		fmt.Fprintf(b, ", %d GCs, %.0f B allocated per message", d.ClientGCs, d.ClientBytesPerMessage)
	}
	if d.DatabaseCPUSeconds > 0 {
		fmt.Fprintf(b, "; database CPU %.2f s", d.DatabaseCPUSeconds)
	}
	if d.Verified {
		fmt.Fprintf(b, "; verified: every message completed exactly once\n")
	} else {
		fmt.Fprintf(b, "; VERIFICATION FAILED: %s\n", d.Problem)
	}
}

// ratio is a/b, 0 when b is 0.
func ratio(a, b int64) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}
