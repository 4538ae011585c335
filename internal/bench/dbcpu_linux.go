//go:build linux

package bench

import (
	"context"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// clockTick is the unit of the CPU times in /proc/<pid>/stat (USER_HZ,
// 100 on every Linux architecture Go supports).
const clockTick = 10 * time.Millisecond

// DatabaseCPU returns the CPU time (user + system) the PostgreSQL server
// behind pool has used so far, or false when that server does not run on
// this machine (or its processes cannot be read): its postmaster's own
// time and that of the children it has reaped (backends that ended),
// plus that of its live children (backends, autovacuum, the WAL writer,
// the checkpointer). The postmaster is the parent of the backend serving
// the query it asks. A backend that ended and was not reaped yet, a
// moment at most, is missed.
func DatabaseCPU(ctx context.Context, pool *pgxpool.Pool) (time.Duration, bool) {
	var backend int
	if err := pool.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&backend); err != nil {
		return 0, false
	}
	postmaster, _, ok := procStat(backend)
	if !ok {
		return 0, false
	}
	if _, own, ok := procStat(postmaster); ok {
		return own + childrenCPU(postmaster), true
	}
	return 0, false
}

// childrenCPU sums the CPU time of the live processes whose parent is
// ppid.
func childrenCPU(ppid int) time.Duration {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0
	}
	var sum time.Duration
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if parent, cpu, ok := procStat(pid); ok && parent == ppid {
			sum += cpu
		}
	}
	return sum
}

// procStat reads /proc/<pid>/stat: the parent's pid and the process's
// CPU time, its reaped children's included (utime, stime, cutime,
// cstime), or false when pid is gone, unreadable or not a postgres
// process.
func procStat(pid int) (ppid int, cpu time.Duration, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, false
	}
	// pid (comm) state ppid ...: comm may hold spaces and parentheses.
	s := string(b)
	open, closing := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || closing < open || !strings.HasPrefix(s[open+1:closing], "postgres") {
		return 0, 0, false
	}
	f := strings.Fields(s[closing+1:])
	if len(f) < 15 { // state is f[0]; ppid f[1]; utime..cstime f[11..14]
		return 0, 0, false
	}
	if ppid, err = strconv.Atoi(f[1]); err != nil {
		return 0, 0, false
	}
	var ticks int64
	for _, v := range f[11:15] {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, 0, false
		}
		ticks += n
	}
	return ppid, time.Duration(ticks) * clockTick, true
}
