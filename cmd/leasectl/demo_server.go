package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// serverStartTimeout bounds how long a throwaway server may take to answer.
const serverStartTimeout = 30 * time.Second

// demoServer is the server the demo runs on.
type demoServer struct {
	url       string // connection string of a database the demo may CREATE DATABASE from
	throwaway bool   // started by the demo, removed by stop
	stop      func()
}

// demoServer finds the server for the demo: the database URL when it
// answers; else, in mode auto with the default URL or in mode always, a
// throwaway server from the installed binaries. It fails with instructions
// when neither works.
func (c *cli) demoServer(ctx context.Context, mode string) (demoServer, error) {
	var pingErr error
	if mode != "always" {
		pingErr = ping(ctx, c.databaseURL)
		if pingErr == nil {
			fmt.Fprintf(c.stdout, "using PostgreSQL at %s\n", describeURL(c.databaseURL))
			return demoServer{url: c.databaseURL, stop: func() {}}, nil
		}
		if ctx.Err() != nil {
			return demoServer{}, ctx.Err()
		}
		if mode == "never" || c.source != urlDefault {
			return demoServer{}, c.noServerError(pingErr, nil)
		}
		fmt.Fprintf(c.stdout, "no PostgreSQL answers at %s (%v)\n", describeURL(c.databaseURL), pingErr)
	}
	srv, err := startThrowaway(ctx, c.stdout)
	if err != nil {
		return demoServer{}, c.noServerError(pingErr, err)
	}
	return demoServer{url: srv.url, throwaway: true, stop: srv.stop}, nil
}

// noServerError explains how to point the demo at a server.
func (c *cli) noServerError(pingErr, throwawayErr error) error {
	var b strings.Builder
	from := map[urlSource]string{urlDefault: "the default URL", urlEnv: "DATABASE_URL", urlFlag: "--database-url"}[c.source]
	b.WriteString("no PostgreSQL server to run on.\n")
	if pingErr != nil {
		fmt.Fprintf(&b, "  %s (from %s) does not answer: %v\n", describeURL(c.databaseURL), from, pingErr)
	}
	if throwawayErr != nil {
		fmt.Fprintf(&b, "  could not start a throwaway server: %v\n", throwawayErr)
	}
	b.WriteString(`The demo needs a PostgreSQL server (12 or later) and a role that may CREATE DATABASE:
it creates its own database leasestore_demo_<random>, drops it at the end and touches
nothing else. Point it at one with either of:
  leasectl demo --database-url 'postgres://USER:PASSWORD@HOST:5432/postgres?sslmode=disable'
  DATABASE_URL='postgres://USER:PASSWORD@HOST:5432/postgres?sslmode=disable' leasectl demo
or start a local server with trust auth on 127.0.0.1:5432: make db-start (scripts/db-start.sh).
With the server binaries installed (initdb and postgres, e.g. apt-get install postgresql),
'leasectl demo --throwaway always' runs on a throwaway server in a temporary directory.`)
	return errors.New(b.String())
}

// ping connects to connString and pings the server.
func ping(ctx context.Context, connString string) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, connString)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	return conn.Ping(ctx)
}

// throwawayServer is a PostgreSQL server the demo started in a temporary
// directory, trust auth on 127.0.0.1 only, fsync off.
type throwawayServer struct {
	dir    string
	url    string
	cmd    *exec.Cmd
	exited chan struct{}
	out    io.Writer
}

// startThrowaway initialises a cluster in a new temporary directory and
// starts a server on a free port. As root it runs the server as the
// postgres user, since PostgreSQL refuses to run as root.
func startThrowaway(ctx context.Context, out io.Writer) (*throwawayServer, error) {
	bin, err := findServerBinaries()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "leasectl-demo-pg-")
	if err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			_ = os.RemoveAll(dir)
		}
	}()
	fmt.Fprintf(out, "starting a throwaway PostgreSQL from %s in %s\n", bin, dir)
	data := filepath.Join(dir, "data")
	initdb := exec.CommandContext(ctx, filepath.Join(bin, "initdb"),
		"-D", data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-locale", "--no-sync")
	initdb.Dir = dir
	if initdb.SysProcAttr, err = serverProcAttr(dir); err != nil {
		return nil, err
	}
	if b, err := initdb.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("initdb: %w: %s", err, lastLines(b, 5))
	}
	// A free port can be taken between the probe and the bind: try again.
	for attempt := 1; ; attempt++ {
		s, err := launchServer(ctx, out, bin, dir, data)
		if err == nil {
			fmt.Fprintf(out, "throwaway server answers at %s\n", describeURL(s.url))
			ok = true
			return s, nil
		}
		if attempt == 3 || ctx.Err() != nil {
			return nil, err
		}
	}
}

func launchServer(ctx context.Context, out io.Writer, bin, dir, data string) (*throwawayServer, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	logPath := filepath.Join(dir, "server.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logFile.Close() // the server holds its own descriptor
	cmd := exec.Command(filepath.Join(bin, "postgres"), "-D", data, "-p", strconv.Itoa(port),
		"-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories=",
		"-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off")
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if cmd.SysProcAttr, err = serverProcAttr(dir); err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start postgres: %w", err)
	}
	s := &throwawayServer{
		dir: dir, cmd: cmd, exited: make(chan struct{}), out: out,
		url: fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port),
	}
	go func() {
		_ = cmd.Wait()
		close(s.exited)
	}()
	deadline := time.Now().Add(serverStartTimeout)
	for {
		if ping(ctx, s.url) == nil {
			return s, nil
		}
		log, _ := os.ReadFile(logPath)
		select {
		case <-s.exited:
			return nil, fmt.Errorf("postgres exited: %s", lastLines(log, 5))
		case <-ctx.Done():
			s.stopProcess()
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			s.stopProcess()
			return nil, fmt.Errorf("postgres did not answer within %s: %s", serverStartTimeout, lastLines(log, 5))
		}
	}
}

// stop shuts the server down and removes its directory.
func (s *throwawayServer) stop() {
	s.stopProcess()
	if err := os.RemoveAll(s.dir); err != nil {
		fmt.Fprintf(s.out, "could not remove %s: %v\n", s.dir, err)
		return
	}
	fmt.Fprintf(s.out, "stopped the throwaway server and removed %s\n", s.dir)
}

// stopProcess asks for a fast shutdown (SIGINT) and kills the server if it
// has not exited after 15 seconds.
func (s *throwawayServer) stopProcess() {
	select {
	case <-s.exited:
		return
	default:
	}
	if err := s.cmd.Process.Signal(os.Interrupt); err != nil {
		_ = s.cmd.Process.Kill()
	}
	select {
	case <-s.exited:
	case <-time.After(15 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.exited
	}
}

// findServerBinaries returns a directory holding initdb and postgres: the
// one of initdb on PATH, else the newest /usr/lib/postgresql/<major>/bin
// (Debian, Ubuntu) or /usr/pgsql-<major>/bin (RHEL).
func findServerBinaries() (string, error) {
	var dirs []string
	if p, err := exec.LookPath("initdb"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			p = real
		}
		dirs = append(dirs, filepath.Dir(p))
	}
	for _, pattern := range []string{"/usr/lib/postgresql/*/bin", "/usr/pgsql-*/bin"} {
		found, _ := filepath.Glob(pattern)
		slices.SortFunc(found, func(a, b string) int { return majorVersion(b) - majorVersion(a) })
		dirs = append(dirs, found...)
	}
	for _, d := range dirs {
		if isExecutable(filepath.Join(d, "initdb")) && isExecutable(filepath.Join(d, "postgres")) {
			return d, nil
		}
	}
	return "", errors.New("no PostgreSQL server binaries (initdb and postgres) on PATH or in /usr/lib/postgresql/*/bin")
}

// majorVersion returns the number in a path like /usr/lib/postgresql/15/bin
// or /usr/pgsql-15/bin, 0 when there is none.
func majorVersion(dir string) int {
	base := filepath.Base(filepath.Dir(dir))
	base = base[strings.LastIndexAny(base, "-/")+1:]
	n, _ := strconv.Atoi(base)
	return n
}

func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0
}

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// lastLines returns the last n non-empty lines of b, joined with " | ".
func lastLines(b []byte, n int) string {
	lines := strings.FieldsFunc(string(b), func(r rune) bool { return r == '\n' || r == '\r' })
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}
