package dbtest_test

import (
	"bufio"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/internal/dbtest"
)

// harnessChildEnv selects what TestHarnessChild does in a child process;
// unset, it skips.
const harnessChildEnv = "LEASESTORE_HARNESS_CHILD"

// TestHarnessChild is the child process of TestHarnessCleanup: it creates a
// test database and a per-test role, prints "READY <run> <database> <role>"
// and then ends the way $LEASESTORE_HARNESS_CHILD says.
func TestHarnessChild(t *testing.T) {
	mode := os.Getenv(harnessChildEnv)
	if mode == "" {
		t.Skip("runs only as TestHarnessCleanup's child")
	}
	u := dbtest.NewEmptyDatabase(t)
	pool := newPool(t, u, "leasestore-harness-child", 2)
	role := dbtest.RoleName(t)
	admin := adminConn(t, u)
	_, err := admin.Exec(t.Context(), "CREATE ROLE "+pgx.Identifier{role}.Sanitize()+" NOLOGIN")
	require.NoError(t, err)
	t.Cleanup(func() {
		if err := dropRole(dbtest.URL(t), role); err != nil {
			t.Errorf("drop role %s: %v", role, err)
		}
	})
	parsed, err := url.Parse(u)
	require.NoError(t, err)
	os.Stdout.WriteString("READY " + dbtest.RunID() + " " + strings.TrimPrefix(parsed.Path, "/") + " " + role + "\n")
	switch mode {
	case "fail":
		t.Fatal("failing on purpose")
	case "panic":
		panic("panicking on purpose")
	case "wait": // for a signal or -test.timeout
		time.Sleep(time.Minute)
	case "gone": // the server goes away while the test uses it
		deadline := time.Now().Add(30 * time.Second)
		for time.Now().Before(deadline) {
			_, err := pool.Exec(t.Context(), "SELECT 1")
			require.NoError(t, err, "the server went away")
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// TestHarnessCleanup runs TestHarnessChild in a child test process that
// fails, panics, times out, is interrupted, or loses its server, and checks
// that the child fails cleanly (no panic of the harness, no hang) and that
// no test database or per-test role of the child is left: at once where
// the child could clean up itself, after the next run's sweep where it
// died first.
func TestHarnessCleanup(t *testing.T) {
	if os.Getenv(harnessChildEnv) != "" {
		t.Skip("not inside the child")
	}
	t.Parallel()
	admin := dbtest.URL(t)
	cases := []struct {
		mode   string
		args   []string
		signal os.Signal
		proxy  bool   // point the child at a proxy that the test closes after READY
		swept  bool   // the child dies before it can clean up: the sweep drops its objects
		output string // in the child's output
	}{
		{mode: "fail", output: "failing on purpose"},
		{mode: "panic", swept: true, output: "panicking on purpose"},
		{mode: "wait", args: []string{"-test.timeout=3s"}, swept: true, output: "test timed out"},
		{mode: "wait", signal: os.Interrupt},
		{mode: "wait", signal: syscall.SIGTERM},
		{mode: "gone", proxy: true, swept: true, output: "the server went away"},
	}
	for _, tc := range cases {
		name := tc.mode
		if tc.signal != nil {
			name += "/" + tc.signal.String()
		}
		if len(tc.args) > 0 {
			name += "/timeout"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			childURL := admin
			var proxy *tcpProxy
			if tc.proxy {
				proxy = newTCPProxy(t, admin)
				childURL = proxy.url
			}
			cmd := exec.Command(os.Args[0], append([]string{"-test.run=^TestHarnessChild$", "-test.v"}, tc.args...)...)
			cmd.Env = append(os.Environ(), harnessChildEnv+"="+tc.mode, "TEST_DATABASE_URL="+childURL, "CI=true")
			stdout, err := cmd.StdoutPipe()
			require.NoError(t, err)
			var out strings.Builder
			var outMu sync.Mutex
			cmd.Stderr = writerFunc(func(p []byte) (int, error) { outMu.Lock(); defer outMu.Unlock(); return out.Write(p) })
			start := time.Now()
			require.NoError(t, cmd.Start())
			ready := make(chan []string, 1)
			copied := make(chan struct{})
			go func() {
				defer close(copied)
				sc := bufio.NewScanner(stdout)
				for sc.Scan() {
					line := sc.Text()
					if f := strings.Fields(line); len(f) == 4 && f[0] == "READY" {
						ready <- f[1:]
					}
					outMu.Lock()
					out.WriteString(line + "\n")
					outMu.Unlock()
				}
			}()
			var made []string
			select {
			case made = <-ready:
			case <-time.After(time.Minute):
				_ = cmd.Process.Kill()
				<-copied
				_ = cmd.Wait()
				t.Fatalf("the child never got ready:\n%s", out.String())
			}
			run, database, role := made[0], made[1], made[2]
			if tc.signal != nil {
				require.NoError(t, cmd.Process.Signal(tc.signal))
			}
			if proxy != nil {
				proxy.Close()
			}
			waited := make(chan error, 1)
			go func() { <-copied; waited <- cmd.Wait() }()
			select {
			case err = <-waited:
			case <-time.After(2 * time.Minute):
				_ = cmd.Process.Kill()
				<-waited
				t.Fatalf("the child hung:\n%s", out.String())
			}
			outMu.Lock()
			output := out.String()
			outMu.Unlock()
			var exitErr *exec.ExitError
			require.ErrorAs(t, err, &exitErr, "the child must fail:\n%s", output)
			require.Contains(t, output, tc.output)
			if tc.mode == "gone" || tc.mode == "fail" {
				require.NotContains(t, output, "panic:", "a clean failure, not a panic")
				require.Contains(t, output, "--- FAIL: TestHarnessChild")
			}
			t.Logf("child %s ended after %v", run, time.Since(start).Round(time.Millisecond))

			if tc.swept {
				// The server may hold the dead child's session, and with it the
				// run's lock, for a moment after the child died (a cut
				// connection is noticed late): sweep until the run is gone or
				// 15 seconds passed, as the next test run's sweep would.
				deadline := time.Now().Add(15 * time.Second)
				for {
					require.NoError(t, dbtest.Sweep(admin))
					if len(harnessLeftovers(t, admin, run)) == 0 || time.Now().After(deadline) {
						break
					}
					time.Sleep(100 * time.Millisecond)
				}
			}
			require.Empty(t, harnessLeftovers(t, admin, run), "objects of run %s (%s, %s) left:\n%s", run, database, role, output)
		})
	}
}

// harnessLeftovers lists the databases and roles of run on admin's server.
func harnessLeftovers(t *testing.T, admin, run string) []string {
	t.Helper()
	conn := adminConn(t, admin)
	rows, err := conn.Query(t.Context(), `
		SELECT datname FROM pg_database WHERE starts_with(datname, $1)
		UNION ALL
		SELECT rolname FROM pg_roles WHERE starts_with(rolname, $2)`,
		dbtest.DatabasePrefix+run+"_", dbtest.RolePrefix+run+"_")
	require.NoError(t, err)
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return names
}

// TestHarnessNoServer points the harness at a port nobody listens on: under
// CI=true the test fails with a message, it does not panic or hang.
func TestHarnessNoServer(t *testing.T) {
	if os.Getenv(harnessChildEnv) != "" {
		t.Skip("not inside the child")
	}
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close()) // nobody listens there now
	cmd := exec.Command(os.Args[0], "-test.run=^TestHarnessChild$", "-test.v")
	cmd.Env = append(os.Environ(), harnessChildEnv+"=fail", "CI=true",
		"TEST_DATABASE_URL=postgres://postgres@"+addr+"/postgres?sslmode=disable&connect_timeout=5")
	out, err := cmd.CombinedOutput()
	var exitErr *exec.ExitError
	require.ErrorAs(t, err, &exitErr, "%s", out)
	require.Contains(t, string(out), "is not reachable")
	require.NotContains(t, string(out), "panic:")
	require.NotContains(t, string(out), "READY")
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// tcpProxy forwards connections to a PostgreSQL server until Close, which
// cuts every connection: to the client, the server went away.
type tcpProxy struct {
	url    string
	ln     net.Listener
	mu     sync.Mutex
	conns  []net.Conn
	wg     sync.WaitGroup
	closed bool
}

func newTCPProxy(t *testing.T, serverURL string) *tcpProxy {
	t.Helper()
	parsed, err := url.Parse(serverURL)
	require.NoError(t, err)
	target := parsed.Host
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	parsed.Host = ln.Addr().String()
	p := &tcpProxy{url: parsed.String(), ln: ln}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				_ = c.Close()
				continue
			}
			if !p.track(c, s) {
				return
			}
			for _, dir := range [][2]net.Conn{{c, s}, {s, c}} {
				p.wg.Add(1)
				go func() {
					defer p.wg.Done()
					_, _ = io.Copy(dir[0], dir[1])
					_ = dir[0].Close()
				}()
			}
		}
	}()
	t.Cleanup(p.Close)
	return p
}

// track records client and server conns, or closes them when the proxy is
// closed and reports false.
func (p *tcpProxy) track(conns ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		for _, c := range conns {
			_ = c.Close()
		}
		return false
	}
	p.conns = append(p.conns, conns...)
	return true
}

// Close stops accepting, cuts every connection and waits for the copying
// goroutines.
func (p *tcpProxy) Close() {
	p.mu.Lock()
	if !p.closed {
		p.closed = true
		_ = p.ln.Close()
		for _, c := range p.conns {
			_ = c.Close()
		}
	}
	p.mu.Unlock()
	p.wg.Wait()
}
