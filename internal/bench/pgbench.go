package bench

import (
	"bytes"
	"context"
	"embed"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasestore/leasestore/leasing"
)

// scripts holds the raw-SQL baselines: the generated claim and complete
// statements as pgbench scripts (TestPgbenchScripts keeps them in step).
//
//go:embed pgbench/*.pgbench
var scripts embed.FS

func scriptName(q leasing.Queue) string {
	if q == leasing.Outbox {
		return "outbox_claim_publish.pgbench"
	}
	return "inbox_claim_complete.pgbench"
}

// hotPathOptions are the settings the store gives each claim and fenced
// write (UseHotPathSettings, lock_timeout aside), as pgbench's session
// options, so that the loop runs the plans the store runs: generic, never
// JIT-compiled. Without them a claim's plan on a table of a few hundred
// thousand rows can be JIT-compiled on every call. TestPgbenchSettings
// keeps them in step with the statement.
const hotPathOptions = "-c plan_cache_mode=force_generic_plan -c jit=off"

// findPgbench returns the pgbench binary to run, or "" and why there is none.
func findPgbench(configured string) (path, why string) {
	if configured != "" {
		if _, err := os.Stat(configured); err != nil {
			return "", fmt.Sprintf("pgbench %s: %v", configured, err)
		}
		return configured, ""
	}
	if p, err := exec.LookPath("pgbench"); err == nil {
		return p, ""
	}
	found, _ := filepath.Glob("/usr/lib/postgresql/*/bin/pgbench")
	if len(found) == 0 {
		return "", "pgbench not found on PATH or in /usr/lib/postgresql/*/bin; install the PostgreSQL client tools or pass its path"
	}
	slices.SortFunc(found, func(a, b string) int { return versionOf(a) - versionOf(b) })
	return found[len(found)-1], ""
}

// versionOf returns the major version in /usr/lib/postgresql/<v>/bin/pgbench.
func versionOf(path string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(path))))
	return v
}

// pgbenchTPS matches pgbench's "tps = 123.4 (without initial connection time)".
var (
	pgbenchTPS     = regexp.MustCompile(`tps = ([0-9.]+) \(without initial connection time\)`)
	pgbenchLatency = regexp.MustCompile(`latency average = ([0-9.]+) ms`)
	pgbenchTxns    = regexp.MustCompile(`number of transactions actually processed: ([0-9]+)`)
)

// drainPgbench drains the table with pgbench running the kept script: one
// client per worker, each running ceil(drained / (workers × batch)) loops, so
// that the loops cover every row; loops that find nothing skip the complete.
func drainPgbench(ctx context.Context, cfg Config, pgbench, dbURL string, pool *pgxpool.Pool, t table, progress *progress) (Drain, error) {
	want := int64(cfg.Messages + cfg.ExpiredLeases)
	script, err := scripts.ReadFile("pgbench/" + scriptName(cfg.Queue))
	if err != nil {
		return Drain{}, err
	}
	dir, err := os.MkdirTemp("", "leasestore-bench-")
	if err != nil {
		return Drain{}, err
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, scriptName(cfg.Queue))
	if err := os.WriteFile(path, script, 0o600); err != nil {
		return Drain{}, err
	}
	perClient := (want + int64(cfg.Workers*cfg.BatchSize) - 1) / int64(cfg.Workers*cfg.BatchSize)
	args := []string{
		"--no-vacuum", "--protocol=prepared",
		"--client=" + strconv.Itoa(cfg.Workers), "--jobs=" + strconv.Itoa(cfg.Workers),
		"--transactions=" + strconv.FormatInt(perClient, 10),
		"--file=" + path,
		"--define=batch=" + strconv.Itoa(cfg.BatchSize),
		"--define=owner=" + leasing.NewOwner("pgbench"),
		"--define=lease_for=" + strconv.FormatInt(int64(cfg.LeaseFor/time.Second), 10) + " seconds",
		dbURL,
	}
	vac0, _, err := tableStats(ctx, pool, t)
	if err != nil {
		return Drain{}, err
	}
	stopVacuum, err := keepVacuumed(ctx, cfg, pool)
	if err != nil {
		return Drain{}, err
	}
	progress.status("pgbench: draining %d messages with %d clients, batch %d", want, cfg.Workers, cfg.BatchSize)
	cmd := exec.CommandContext(ctx, pgbench, args...)
	cmd.Env = append(os.Environ(), "PGOPTIONS="+strings.TrimSpace(os.Getenv("PGOPTIONS")+" "+hotPathOptions))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	dbCPU := databaseCPUSince(ctx, pool)
	start := time.Now()
	err = cmd.Run()
	elapsed := time.Since(start)
	dbSeconds := dbCPU()
	progress.done()
	if vacErr := stopVacuum(); err == nil && vacErr != nil {
		return Drain{}, vacErr
	}
	if err != nil {
		return Drain{}, fmt.Errorf("bench: pgbench: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	tps, ok1 := match(pgbenchTPS, stdout.String())
	txns, ok2 := match(pgbenchTxns, stdout.String())
	lat, _ := match(pgbenchLatency, stdout.String())
	if !ok1 || !ok2 || tps <= 0 {
		return Drain{}, fmt.Errorf("bench: cannot read pgbench output:\n%s", stdout.String())
	}
	// Loops ran at tps; the drain took txns/tps seconds after connecting.
	seconds := txns / tps
	if seconds <= 0 || seconds > elapsed.Seconds() {
		seconds = elapsed.Seconds()
	}
	d := Drain{
		Method: "pgbench", Seconds: seconds, MessagesPerSecond: float64(want) / seconds,
		Claims: int(txns), LoopAvgMs: lat,
		ClientCPUSeconds:   (cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()).Seconds(),
		DatabaseCPUSeconds: dbSeconds,
	}
	if err := finish(ctx, &d, pool, t, want, vac0); err != nil {
		return Drain{}, err
	}
	return d, nil
}

func match(re *regexp.Regexp, s string) (float64, bool) {
	m := re.FindStringSubmatch(s)
	if m == nil {
		return 0, false
	}
	v, err := strconv.ParseFloat(m[1], 64)
	return v, err == nil
}
