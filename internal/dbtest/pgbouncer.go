package dbtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// bouncer is the test process's one PgBouncer, in transaction pooling
// mode, in front of the server URL names: started by the first
// PgBouncerURL call on a free port of its own, with a generated
// configuration in a temporary directory, and stopped by Main after the
// tests (and with the process, on Linux, should it die first).
//
// Every database of the server is reachable through it under its own name
// (a wildcard entry), as the user the URL names, without a password
// (auth_type trust): the test server trusts local connections.
var bouncer struct {
	once sync.Once
	err  error
	cmd  *exec.Cmd
	dir  string
	host string
	port int
}

// pgbouncerStartTimeout bounds the wait for a started PgBouncer to accept
// connections.
const pgbouncerStartTimeout = 15 * time.Second

// PgBouncerURL returns dbURL (a database of the test server, e.g. from
// DatabaseURL) as reached through the process's PgBouncer in transaction
// pooling mode, starting it on first use.
//
// The test is skipped when no pgbouncer binary is installed, or fails when
// the environment has CI=true (.ci/run installs Debian's pgbouncer).
func PgBouncerURL(tb testing.TB, dbURL string) string {
	tb.Helper()
	admin := URL(tb)
	bin := pgbouncerBinary()
	if bin == "" {
		msg := "dbtest: no pgbouncer binary (apt-get install pgbouncer)"
		if os.Getenv("CI") == "true" {
			tb.Fatal(msg)
		}
		tb.Skip(msg)
	}
	bouncer.once.Do(func() { bouncer.err = startPgBouncer(bin, admin) })
	if bouncer.err != nil {
		tb.Fatalf("dbtest: start pgbouncer: %v", bouncer.err)
	}
	u, err := url.Parse(dbURL)
	if err != nil {
		tb.Fatalf("dbtest: parse database URL: %v", err)
	}
	u.Host = net.JoinHostPort(bouncer.host, strconv.Itoa(bouncer.port))
	return u.String()
}

// pgbouncerBinary returns the path of pgbouncer, or "" when there is none.
// Debian installs it in /usr/sbin, which is not on every user's PATH.
func pgbouncerBinary() string {
	if p, err := exec.LookPath("pgbouncer"); err == nil {
		return p
	}
	if _, err := os.Stat("/usr/sbin/pgbouncer"); err == nil {
		return "/usr/sbin/pgbouncer"
	}
	return ""
}

// startPgBouncer writes a configuration for a PgBouncer in front of the
// server of admin, starts it and waits until it accepts connections.
func startPgBouncer(bin, admin string) error {
	cfg, err := pgx.ParseConfig(admin)
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "leasestore-pgbouncer-")
	if err != nil {
		return err
	}
	// PgBouncer refuses to run as root: then it runs as the postgres OS
	// user (scripts/db-start.sh runs the server as that user too).
	var cred *syscall.Credential
	if os.Geteuid() == 0 {
		pg, err := user.Lookup("postgres")
		if err != nil {
			return fmt.Errorf("running as root needs a postgres OS user: %w", err)
		}
		uid, _ := strconv.Atoi(pg.Uid)
		gid, _ := strconv.Atoi(pg.Gid)
		cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(dir, uid, gid); err != nil {
			return err
		}
	}
	port, err := freePort()
	if err != nil {
		return err
	}
	authFile := filepath.Join(dir, "userlist.txt")
	ini := filepath.Join(dir, "pgbouncer.ini")
	files := map[string]string{
		authFile: fmt.Sprintf("%q \"\"\n", cfg.User),
		ini: strings.Join([]string{
			"[databases]",
			fmt.Sprintf("* = host=%s port=%d", cfg.Host, cfg.Port),
			"[pgbouncer]",
			"listen_addr = 127.0.0.1",
			fmt.Sprintf("listen_port = %d", port),
			"unix_socket_dir =",
			"auth_type = trust",
			"auth_file = " + authFile,
			"pool_mode = transaction",
			"max_client_conn = 1000",
			"default_pool_size = 20",
			"max_db_connections = 60",
			"log_connections = 0",
			"log_disconnections = 0",
			"logfile = " + filepath.Join(dir, "pgbouncer.log"),
			"pidfile = " + filepath.Join(dir, "pgbouncer.pid"),
			"",
		}, "\n"),
	}
	for name, text := range files {
		if err := os.WriteFile(name, []byte(text), 0o644); err != nil {
			return err
		}
	}
	cmd := exec.Command(bin, "-q", ini)
	cmd.SysProcAttr = pgbouncerProcAttr(cred)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		return err
	}
	bouncer.cmd, bouncer.dir, bouncer.host, bouncer.port = cmd, dir, "127.0.0.1", port

	pooled, err := url.Parse(admin)
	if err != nil {
		return err
	}
	pooled.Host = net.JoinHostPort(bouncer.host, strconv.Itoa(port))
	deadline := time.Now().Add(pgbouncerStartTimeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		conn, err := pgx.Connect(ctx, pooled.String())
		if err == nil {
			err = conn.Ping(ctx)
			_ = conn.Close(ctx)
		}
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(dir, "pgbouncer.log"))
			stopPgBouncer()
			return fmt.Errorf("not accepting connections after %s: %w\n%s", pgbouncerStartTimeout, err, log)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// stopPgBouncer stops the process's PgBouncer, if it started one, and
// removes its directory.
func stopPgBouncer() {
	if bouncer.cmd == nil {
		return
	}
	_ = bouncer.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- bouncer.cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = bouncer.cmd.Process.Kill()
		<-done
	}
	bouncer.cmd = nil
	_ = os.RemoveAll(bouncer.dir)
}

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	addr, ok := l.Addr().(*net.TCPAddr)
	if !ok {
		return 0, errors.New("not a TCP address")
	}
	return addr.Port, nil
}
