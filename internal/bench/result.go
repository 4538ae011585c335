package bench

import (
	"slices"
	"time"

	"github.com/leasestore/leasestore/internal/explain"
)

// Result is what a Run measured. Durations are in the unit their name says.
type Result struct {
	// Database is the database Run created; Kept says whether it is still there.
	Database string `json:"database"`
	Kept     bool   `json:"kept"`
	// Queue, Messages ... ExplainBatch echo the configuration. Drained is
	// the number of rows a drain must finish: Messages + ExpiredLeases.
	Queue         string `json:"queue"`
	Messages      int    `json:"messages"`
	TerminalRows  int    `json:"terminal_rows"`
	DeferredRows  int    `json:"deferred_rows"`
	ExpiredLeases int    `json:"expired_leases"`
	Drained       int    `json:"drained"`
	Workers       int    `json:"workers"`
	BatchSize     int    `json:"batch_size"`
	ExplainBatch  int    `json:"explain_batch"`
	// RegisteredTypes says whether the workers' connections ran
	// leasing.RegisterTypes.
	RegisteredTypes bool `json:"registered_types"`
	// MergedCompletions is Config.MergeCompletions.
	MergedCompletions bool `json:"merged_completions,omitempty"`
	// FillSeconds is the time the fill, VACUUM and ANALYZE took.
	FillSeconds float64 `json:"fill_seconds"`
	// Clean is the plan cost of a claim of ExplainBatch rows right after
	// the fill: the median of several rolled-back claims.
	Clean ClaimCost `json:"clean_claim"`
	// CleanGeneric is the same for the claim's generic plan (see
	// explain.ClaimGeneric).
	CleanGeneric ClaimCost `json:"clean_generic_claim"`
	// TopicRows is Config.TopicRows; Topic and TopicGeneric are the plan
	// costs, measured as Clean and CleanGeneric are, of the same claim
	// scoped to their topic (leasing.ClaimRequest.Topics) with every due
	// row of the fill, of other topics, ahead. Nil without TopicRows.
	TopicRows    int        `json:"topic_rows,omitempty"`
	Topic        *ClaimCost `json:"topic_claim,omitempty"`
	TopicGeneric *ClaimCost `json:"topic_generic_claim,omitempty"`
	// Sampled is the API drain the claim-cost samples (Steady) were taken
	// in, when it ran on its own before the rounds: it does when the
	// pgbench baseline runs, because the samples pause the drain's workers
	// and would handicap it against pgbench. Its rate is not compared. Nil
	// otherwise: the first round's API drain samples.
	Sampled *Drain `json:"sampled,omitempty"`
	// API is the first round's drain through the leasing API; nil with
	// SkipDrain.
	API *Drain `json:"api,omitempty"`
	// Raw is the first round's pgbench drain of the same statements; nil
	// when skipped.
	Raw *Drain `json:"raw,omitempty"`
	// Rounds holds every round's drains, in the order they ran (the first
	// is API and Raw again).
	Rounds []Round `json:"rounds,omitempty"`
	// APIVsRaw is API messages/s divided by raw messages/s, the median over
	// the rounds (the mean of the middle two for an even count); 0 without
	// both drains.
	APIVsRaw float64 `json:"api_vs_raw,omitempty"`
	// ProcessorVsRaw is the same for the processors' drains
	// (Config.Processors); 0 without both.
	ProcessorVsRaw float64 `json:"processor_vs_raw,omitempty"`
	// Steady is the claim cost sampled during Sampled, or during the first
	// round's API drain; nil when sampling is off or the drain was skipped.
	Steady *Steady `json:"steady_state,omitempty"`
	// RawSkipped says why the raw baseline did not run, if it did not.
	RawSkipped string `json:"raw_skipped,omitempty"`
	// OrderingKeys echoes Config.OrderingKeys; KeyedVsUnkeyed is keyed
	// messages/s over unkeyed, the median over the rounds (0 without keys).
	OrderingKeys   int     `json:"ordering_keys,omitempty"`
	KeyedVsUnkeyed float64 `json:"keyed_vs_unkeyed,omitempty"`
}

// Round is one API drain and the pgbench drain after it, each on a freshly
// filled table.
type Round struct {
	// API is the drain through the leasing API.
	API *Drain `json:"api"`
	// Raw is nil when the baseline was skipped.
	Raw *Drain `json:"raw,omitempty"`
	// APIVsRaw is API messages/s divided by Raw messages/s; 0 without Raw.
	APIVsRaw float64 `json:"api_vs_raw,omitempty"`
	// Processor is the processors' drain (Config.Processors), and
	// ProcessorVsRaw its messages/s over Raw's; nil and 0 without it.
	Processor      *Drain  `json:"processor,omitempty"`
	ProcessorVsRaw float64 `json:"processor_vs_raw,omitempty"`
	// Keyed is the drain of keyed messages after API (OrderingKeys), and
	// KeyedVsUnkeyed its messages/s over API's; nil and 0 without keys.
	Keyed          *Drain  `json:"keyed,omitempty"`
	KeyedVsUnkeyed float64 `json:"keyed_vs_unkeyed,omitempty"`
}

// Drains returns every drain of res, in the order they ran.
func (res Result) Drains() []*Drain {
	var out []*Drain
	if res.Sampled != nil {
		out = append(out, res.Sampled)
	}
	for _, r := range res.Rounds {
		out = append(out, r.API)
		if r.Raw != nil {
			out = append(out, r.Raw)
		}
		if r.Processor != nil {
			out = append(out, r.Processor)
		}
		if r.Keyed != nil {
			out = append(out, r.Keyed)
		}
	}
	return out
}

// ClaimCost is the plan cost of one claim (see explain.ClaimPlan).
type ClaimCost struct {
	Rows             int      `json:"claim_rows"`
	Buffers          int64    `json:"claim_buffers"`
	Ms               float64  `json:"claim_ms"`
	TempBlocks       int64    `json:"temp_blocks"`
	JIT              bool     `json:"jit"`
	SeqScan          bool     `json:"seq_scan"`
	SortOverEligible bool     `json:"sort_over_eligible"`
	Plan             []string `json:"claim_plan,omitempty"`
}

func costOf(p explain.ClaimPlan, withPlan bool) ClaimCost {
	c := ClaimCost{
		Rows: p.Rows, Buffers: p.Buffers, Ms: ms(p.Duration), TempBlocks: p.TempBlocks,
		JIT: p.JIT, SeqScan: p.SeqScan, SortOverEligible: p.SortOverEligible,
	}
	if withPlan {
		c.Plan = p.Nodes
	}
	return c
}

// Drain is one drain's throughput and latency. Latencies are per call, in
// milliseconds, as the client saw them.
type Drain struct {
	// Method is "leasing" (the Go API), "pgbench" (raw SQL), "processor"
	// (Config.Processors) or "keyed" (Config.OrderingKeys).
	Method            string  `json:"method"`
	Seconds           float64 `json:"seconds"`
	MessagesPerSecond float64 `json:"messages_per_second"`
	// Claims counts claim calls, EmptyClaims those that returned no row.
	Claims      int `json:"claims"`
	EmptyClaims int `json:"empty_claims"`
	// RoundTrips is the leasing drain's round trips per batch: 1 when
	// each step was one CompleteAndClaim call, 2 with Config.TwoRoundTrips.
	RoundTrips int `json:"round_trips,omitempty"`
	// ClaimP50Ms ... CompleteAndClaimP99Ms are leasing only: Claim and
	// Complete calls made on their own (with TwoRoundTrips, and the first
	// claim and last complete of each worker), and CompleteAndClaim calls.
	ClaimP50Ms            float64 `json:"claim_p50_ms,omitempty"`
	ClaimP99Ms            float64 `json:"claim_p99_ms,omitempty"`
	CompleteP50Ms         float64 `json:"complete_p50_ms,omitempty"`
	CompleteP99Ms         float64 `json:"complete_p99_ms,omitempty"`
	CompleteAndClaimP50Ms float64 `json:"complete_and_claim_p50_ms,omitempty"`
	CompleteAndClaimP99Ms float64 `json:"complete_and_claim_p99_ms,omitempty"`
	// LoopAvgMs is pgbench's average latency of one claim + complete loop.
	LoopAvgMs float64 `json:"loop_avg_ms,omitempty"`
	// ClientCPUSeconds is the CPU time (user + system, seconds) of the
	// draining client. For leasing it is this whole process from the
	// workers' start to their end, the pools already connected: the
	// workers, the vacuum policy's loop, the progress line, the claim-cost
	// sampler when it runs, and garbage collection, also of garbage left
	// by the fill (and anything else the process runs meanwhile, e.g.
	// parallel tests). For pgbench it is the pgbench process's whole life,
	// its connecting included, which Seconds leaves out. On a machine
	// whose cores the client shares with the server, it is CPU the server
	// did not get. 0 where the system does not report it.
	ClientCPUSeconds float64 `json:"client_cpu_seconds,omitempty"`
	// DatabaseCPUSeconds is the CPU time (user + system, seconds) of the
	// PostgreSQL server over the same span as ClientCPUSeconds, all its
	// processes (DatabaseCPU): the drain's statements, the vacuum
	// policy's VACUUMs and the server's own background work. 0 where the
	// server does not run on this machine or is not read (not Linux).
	DatabaseCPUSeconds float64 `json:"database_cpu_seconds,omitempty"`
	// ClientGCs counts the garbage collections this process's Go runtime
	// completed over the same span as ClientCPUSeconds, and
	// ClientBytesPerMessage is the bytes it allocated on the heap meanwhile
	// per message drained: the drains this process runs (leasing, keyed
	// and processor; 0 for pgbench), everything it ran meanwhile included,
	// as for ClientCPUSeconds. A process with a small live heap, as this one,
	// collects each time it has allocated about that heap's size again
	// (GOGC=100), so collections grow with the bytes per message.
	ClientGCs             int64   `json:"client_gcs,omitempty"`
	ClientBytesPerMessage float64 `json:"client_bytes_per_message,omitempty"`
	// Autovacuums counts autovacuum runs on the table during the drain.
	Autovacuums int64 `json:"autovacuums"`
	// Vacuums counts the other VACUUMs of the table during the drain: the
	// vacuum policy's.
	Vacuums int64 `json:"vacuums"`
	// KeyVacuums counts the VACUUMs of the ordering keys' table during the
	// drain, autovacuum's left out: the vacuum policy's.
	KeyVacuums int64 `json:"key_vacuums"`
	// Verified is true when every row was completed exactly once and no
	// other row changed; Problem says what failed otherwise.
	Verified bool   `json:"verified"`
	Problem  string `json:"problem,omitempty"`
}

// Steady is the claim cost sampled during a drain.
type Steady struct {
	Samples []Sample `json:"samples"`
	// CleanBuffers is Result.Clean.Buffers; P50Buffers and MaxBuffers are
	// over the quiesced samples that claimed a full ExplainBatch, and
	// LiveP50Buffers and LiveMaxBuffers over the live ones.
	CleanBuffers   int64 `json:"clean_buffers"`
	P50Buffers     int64 `json:"p50_buffers"`
	MaxBuffers     int64 `json:"max_buffers"`
	LiveP50Buffers int64 `json:"live_p50_buffers"`
	LiveMaxBuffers int64 `json:"live_max_buffers"`
	// MaxRatio is MaxBuffers / CleanBuffers, LiveMaxRatio the same for the
	// live samples.
	MaxRatio     float64 `json:"max_ratio"`
	LiveMaxRatio float64 `json:"live_max_ratio"`
}

// Sample is one claim measured during a drain, twice: live, while the
// workers' claims run and it must skip the rows they lock, and quiesced,
// with the workers held between two batches, which shows the state of the
// table and its indexes alone.
type Sample struct {
	// Drained is how many messages the drain had finished.
	Drained int64 `json:"drained"`
	// Rows, Buffers and Ms are the quiesced claim's.
	Rows    int     `json:"claim_rows"`
	Buffers int64   `json:"claim_buffers"`
	Ms      float64 `json:"claim_ms"`
	// LiveRows, LiveBuffers and LiveMs are the live claim's.
	LiveRows    int     `json:"live_claim_rows"`
	LiveBuffers int64   `json:"live_claim_buffers"`
	LiveMs      float64 `json:"live_claim_ms"`
	// DeadTuples is the table's dead row estimate at the sample.
	DeadTuples int64 `json:"dead_tuples"`
	// Autovacuums and Vacuums are the table's autovacuum and other VACUUM
	// counts when the sample was taken.
	Autovacuums int64 `json:"autovacuums"`
	Vacuums     int64 `json:"vacuums"`
}

// median returns the median of xs (the mean of the middle two for an even
// count), or 0 for none.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(xs))
	if n := len(s); n%2 == 0 {
		return (s[n/2-1] + s[n/2]) / 2
	}
	return s[len(s)/2]
}

// percentileMs returns the q-quantile of lat in milliseconds (nearest rank).
func percentileMs(lat []time.Duration, q float64) float64 {
	if len(lat) == 0 {
		return 0
	}
	s := slices.Clone(lat)
	slices.Sort(s)
	i := int(q*float64(len(s))+0.5) - 1
	return ms(s[min(max(i, 0), len(s)-1)])
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
