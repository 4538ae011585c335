// Package pgcluster runs a throwaway PostgreSQL primary with one streaming
// standby from the server's own binaries (initdb, pg_ctl, pg_basebackup),
// for tests that fail the primary over to the standby. Everything lives in
// a temporary directory on local ports; the test's Cleanup stops the
// servers and the proxies and deletes the directory, also when the test
// fails.
//
// The servers trade durability for speed: fsync off, small shared buffers
// and WAL segments, no checkpoints on their own. That loses nothing the
// tests look at, since the tests fail a server over by stopping it, never
// by crashing the machine: a commit that the standby acknowledged is in
// its data directory whatever fsync says. Synchronous replication still
// holds each commit until the standby wrote it.
//
// As root, the servers run as the postgres OS user (initdb and pg_ctl
// refuse root), as scripts/pg-newest.sh does.
package pgcluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasestore/leasestore/db"
)

// BinDirEnv names the environment variable that overrides the directory of
// the server binaries (DefaultBinDir).
const BinDirEnv = "LEASESTORE_PG_BIN"

// DefaultBinDir holds PostgreSQL 15's binaries on Debian.
const DefaultBinDir = "/usr/lib/postgresql/15/bin"

// StandbyName is the standby's application_name, the name a synchronous
// primary waits for.
const StandbyName = "standby1"

// Mode is how the primary replicates to the standby.
type Mode int

const (
	// Async commits on the primary alone; the standby follows behind.
	Async Mode = iota
	// Sync holds each commit until the standby wrote its WAL
	// (synchronous_standby_names = standby1, synchronous_commit = on).
	Sync
)

// String returns "sync" or "async".
func (m Mode) String() string {
	if m == Sync {
		return "sync"
	}
	return "async"
}

// Options configures a Cluster.
type Options struct {
	// Mode is the replication mode; Async by default.
	Mode Mode
	// ReplicationProxy, when true, connects the standby to the primary
	// through a Proxy (Cluster.ReplicationProxy), so that a test can
	// black-hole the WAL stream.
	ReplicationProxy bool
}

// Node is one server of a cluster.
type Node struct {
	Name string // "primary" or "standby"
	Port int    // on 127.0.0.1
	Dir  string // data directory
}

// Addr returns the node's host:port.
func (n *Node) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(n.Port)) }

// URL returns a URL to the node's postgres database as user postgres.
func (n *Node) URL() string {
	return fmt.Sprintf("postgres://postgres@%s/postgres?sslmode=disable", n.Addr())
}

// Cluster is a primary and a streaming standby. Primary and Standby keep
// their roles' names at the start: after Failover the standby is the
// primary.
type Cluster struct {
	tb       testing.TB
	bin      string
	root     string
	mode     Mode
	Primary  *Node
	Standby  *Node
	replica  *Proxy // between the standby and the primary; nil without Options.ReplicationProxy
	mu       sync.Mutex
	running  map[*Node]bool
	promoted bool
}

// BinDir returns the directory of the server binaries and whether initdb is
// there.
func BinDir() (string, bool) {
	dir := os.Getenv(BinDirEnv)
	if dir == "" {
		dir = DefaultBinDir
	}
	_, err := os.Stat(filepath.Join(dir, "initdb"))
	return dir, err == nil
}

// Start starts a primary, migrated with db.MigrateUp, and a standby that
// streams from it and has caught up. It skips the test when the binaries
// are missing, unless CI is "true", where it fails it.
func Start(tb testing.TB, opts Options) *Cluster {
	tb.Helper()
	bin, ok := BinDir()
	if !ok {
		if os.Getenv("CI") == "true" {
			tb.Fatalf("pgcluster: no PostgreSQL binaries in %s (set %s)", bin, BinDirEnv)
		}
		tb.Skipf("pgcluster: no PostgreSQL binaries in %s (set %s)", bin, BinDirEnv)
	}
	tmpl, err := template()
	if err != nil {
		tb.Fatalf("pgcluster: template: %v", err)
	}
	root, err := makeDir("leasestore-cluster-")
	if err != nil {
		tb.Fatal(err)
	}
	c := &Cluster{tb: tb, bin: bin, root: root, mode: opts.Mode, running: map[*Node]bool{}}
	live.Store(c, struct{}{})
	tb.Cleanup(c.close)
	c.Primary = &Node{Name: "primary", Port: freePort(tb), Dir: filepath.Join(root, "primary")}
	c.Standby = &Node{Name: "standby", Port: freePort(tb), Dir: filepath.Join(root, "standby")}
	if err := c.run("cp", "-a", tmpl, c.Primary.Dir); err != nil {
		tb.Fatal(err)
	}
	conf := ""
	if opts.Mode == Sync {
		conf = "synchronous_standby_names = '" + StandbyName + "'\nsynchronous_commit = on\n"
	}
	if err := c.appendConf(c.Primary, conf); err != nil {
		tb.Fatal(err)
	}
	c.startNode(c.Primary)
	upstream := c.Primary.Addr()
	if opts.ReplicationProxy {
		c.replica = NewProxy(tb, upstream)
		upstream = c.replica.Addr()
	}
	host, port, _ := net.SplitHostPort(upstream)
	if err := c.run(c.tool("pg_basebackup"), "-D", c.Standby.Dir, "-h", host, "-p", port, "-U", "postgres",
		"-X", "stream", "-c", "fast", "--no-sync"); err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(c.Standby.Dir, "standby.signal"), nil, 0o600); err != nil {
		tb.Fatal(err)
	}
	if err := c.chown(filepath.Join(c.Standby.Dir, "standby.signal")); err != nil {
		tb.Fatal(err)
	}
	if err := c.appendConf(c.Standby, fmt.Sprintf(
		"primary_conninfo = 'host=%s port=%s user=postgres application_name=%s'\nsynchronous_standby_names = ''\n",
		host, port, StandbyName)); err != nil {
		tb.Fatal(err)
	}
	c.startNode(c.Standby)
	c.waitStreaming()
	return c
}

// Mode returns the cluster's replication mode.
func (c *Cluster) Mode() Mode { return c.mode }

// ReplicationProxy returns the proxy the standby streams through, or nil
// without Options.ReplicationProxy.
func (c *Cluster) ReplicationProxy() *Proxy { return c.replica }

// MultiHostURL returns a URL that lists the primary, then the standby,
// with target_session_attrs=read-write: a connection reaches whichever
// accepts writes.
func (c *Cluster) MultiHostURL() string {
	return fmt.Sprintf("postgres://postgres@%s,%s/postgres?sslmode=disable&target_session_attrs=read-write&connect_timeout=2",
		c.Primary.Addr(), c.Standby.Addr())
}

// StopPrimary stops the primary: "fast" ends its sessions with SQLSTATE
// 57P01 and sends the standby all of its WAL first; "immediate" kills the
// server as a crash would, so that WAL not yet streamed stays behind.
func (c *Cluster) StopPrimary(mode string) {
	c.tb.Helper()
	if err := c.run(c.tool("pg_ctl"), "-D", c.Primary.Dir, "-m", mode, "-w", "-t", "60", "stop"); err != nil {
		c.tb.Fatalf("pgcluster: stop the primary: %v", err)
	}
	c.mu.Lock()
	c.running[c.Primary] = false
	c.mu.Unlock()
}

// Promote promotes the standby and returns once it accepts writes.
func (c *Cluster) Promote() {
	c.tb.Helper()
	if err := c.run(c.tool("pg_ctl"), "-D", c.Standby.Dir, "-w", "-t", "60", "promote"); err != nil {
		c.tb.Fatalf("pgcluster: promote the standby: %v", err)
	}
	c.mu.Lock()
	c.promoted = true
	c.mu.Unlock()
}

// Failover stops the primary with mode (see StopPrimary) and promotes the
// standby; it returns when the standby accepts writes, with the time the
// primary stopped.
func (c *Cluster) Failover(mode string) (primaryStopped time.Time) {
	c.tb.Helper()
	c.StopPrimary(mode)
	stopped := time.Now()
	c.Promote()
	return stopped
}

// WaitReplayed waits until the standby replayed all the WAL the primary
// wrote so far, as pg_stat_replication shows it.
func (c *Cluster) WaitReplayed(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, c.Primary.URL())
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var lsn string
	if err := conn.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&lsn); err != nil {
		return err
	}
	for {
		var done bool
		err := conn.QueryRow(ctx, "SELECT coalesce(bool_or(replay_lsn >= $1::text::pg_lsn), false) FROM pg_stat_replication", lsn).Scan(&done)
		if err != nil || done {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// waitStreaming waits until the primary sees the standby streaming, and in
// Sync mode as its synchronous standby.
func (c *Cluster) waitStreaming() {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.Primary.URL())
	if err != nil {
		c.tb.Fatalf("pgcluster: connect to the primary: %v", err)
	}
	defer conn.Close(context.Background())
	want := "async"
	if c.mode == Sync {
		want = "sync"
	}
	for {
		var n int
		err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming' AND sync_state = $1", want).Scan(&n)
		if err != nil {
			c.tb.Fatalf("pgcluster: wait for the standby: %v", err)
		}
		if n == 1 {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// startNode starts n's server with the harness's settings.
func (c *Cluster) startNode(n *Node) {
	c.tb.Helper()
	opts := strings.Join([]string{
		"-c listen_addresses=127.0.0.1", "-c port=" + strconv.Itoa(n.Port), "-c unix_socket_directories=" + n.Dir,
	}, " ")
	err := c.run(c.tool("pg_ctl"), "-D", n.Dir, "-l", c.logFile(n), "-w", "-t", "60", "-o", opts, "start")
	if err != nil {
		log, _ := os.ReadFile(c.logFile(n))
		c.tb.Fatalf("pgcluster: start the %s: %v\n%s", n.Name, err, log)
	}
	c.mu.Lock()
	c.running[n] = true
	c.mu.Unlock()
}

// close stops every server still running and deletes the directory.
func (c *Cluster) close() {
	live.Delete(c)
	c.mu.Lock()
	defer c.mu.Unlock()
	for n, up := range c.running {
		if up {
			if err := c.run(c.tool("pg_ctl"), "-D", n.Dir, "-m", "immediate", "-w", "-t", "60", "stop"); err != nil {
				c.tb.Errorf("pgcluster: stop the %s: %v", n.Name, err)
			}
			c.running[n] = false
		}
	}
	if c.tb.Failed() {
		for _, n := range []*Node{c.Primary, c.Standby} {
			if n != nil {
				if log, err := os.ReadFile(c.logFile(n)); err == nil {
					c.tb.Logf("pgcluster: the %s's log:\n%s", n.Name, tail(log, 40))
				}
			}
		}
	}
	if err := os.RemoveAll(c.root); err != nil {
		c.tb.Errorf("pgcluster: %v", err)
	}
}

// logFile is n's server log, beside its data directory (pg_basebackup
// would copy a log inside it).
func (c *Cluster) logFile(n *Node) string { return filepath.Join(c.root, n.Name+".log") }

func (c *Cluster) tool(name string) string { return filepath.Join(c.bin, name) }

func (c *Cluster) run(name string, args ...string) error { return runAs(name, args...) }

func (c *Cluster) chown(path string) error { return chownPostgres(path) }

// appendConf appends text to n's postgresql.auto.conf.
func (c *Cluster) appendConf(n *Node, text string) error {
	f, err := os.OpenFile(filepath.Join(n.Dir, "postgresql.auto.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(text)
	return errors.Join(err, f.Close())
}

// template returns a data directory, made once per process, that holds an
// initialized and migrated primary's data, stopped.
var template = sync.OnceValues(func() (string, error) {
	bin, _ := BinDir()
	root, err := makeDir("leasestore-cluster-template-")
	if err != nil {
		return "", err
	}
	templates.Store(root, nil)
	dir := filepath.Join(root, "data")
	if err := runAs(filepath.Join(bin, "initdb"), "-D", dir, "-U", "postgres", "--auth=trust", "-E", "UTF8",
		"--no-sync", "--wal-segsize=1"); err != nil {
		return "", err
	}
	conf := strings.Join([]string{
		"fsync = off", "shared_buffers = 16MB", "max_connections = 100", "max_wal_senders = 4",
		"wal_keep_size = 256MB", "checkpoint_timeout = 1h", "max_wal_size = 1GB", "wal_sender_timeout = 5s",
		"wal_receiver_timeout = 5s", "wal_receiver_status_interval = 1s", "hot_standby = on",
		"log_min_messages = warning", "",
	}, "\n")
	f, err := os.OpenFile(filepath.Join(dir, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return "", err
	}
	if _, err := f.WriteString(conf); err != nil {
		return "", errors.Join(err, f.Close())
	}
	if err := f.Close(); err != nil {
		return "", err
	}
	port, err := pickPort()
	if err != nil {
		return "", err
	}
	if err := runAs(filepath.Join(bin, "pg_ctl"), "-D", dir, "-l", filepath.Join(root, "server.log"), "-w", "-t", "60",
		"-o", fmt.Sprintf("-c listen_addresses=127.0.0.1 -c port=%d -c unix_socket_directories=%s", port, dir), "start"); err != nil {
		return "", err
	}
	stop := func() error {
		return runAs(filepath.Join(bin, "pg_ctl"), "-D", dir, "-m", "fast", "-w", "-t", "60", "stop")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port))
	if err != nil {
		return "", errors.Join(err, stop())
	}
	_, err = db.MigrateUp(ctx, pool)
	pool.Close()
	if err != nil {
		return "", errors.Join(fmt.Errorf("migrate: %w", err), stop())
	}
	if err := stop(); err != nil {
		return "", err
	}
	return dir, nil
})

// templates holds the template's directory, and live the clusters not
// closed yet, for Main.
var (
	templates sync.Map
	live      sync.Map // *Cluster -> struct{}
)

// M is what TestMain hands Main: a *testing.M, or a wrapper of one.
type M interface{ Run() int }

// Main wraps m so that its Run deletes the template directory after the
// tests, and stops every cluster and deletes its directory when the
// process receives SIGINT or SIGTERM (then dies of the signal). Use it as
// goleak.VerifyTestMain(pgcluster.Main(m)).
func Main(m M) M { return mainM{m} }

type mainM struct{ m M }

// Run runs the tests with the interrupt handler installed.
func (w mainM) Run() int {
	sigs := make(chan os.Signal, 1)
	done := make(chan struct{})
	stopped := make(chan struct{})
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go func() {
		defer close(stopped)
		select {
		case sig := <-sigs:
			live.Range(func(k, _ any) bool {
				k.(*Cluster).close()
				return true
			})
			removeTemplates()
			signal.Reset(sig)
			if p, err := os.FindProcess(os.Getpid()); err == nil {
				_ = p.Signal(sig)
			}
		case <-done:
		}
	}()
	defer func() {
		signal.Stop(sigs)
		close(done)
		<-stopped
		removeTemplates()
	}()
	return w.m.Run()
}

func removeTemplates() {
	templates.Range(func(k, _ any) bool {
		_ = os.RemoveAll(k.(string))
		return true
	})
}

// makeDir makes a temporary directory the postgres OS user may use.
func makeDir(prefix string) (string, error) {
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		return "", err
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return "", err
	}
	return dir, chownPostgres(dir)
}

// asRoot reports whether the process runs as root, when the servers run
// as the postgres OS user.
func asRoot() bool { return os.Geteuid() == 0 }

// chownPostgres gives path to the postgres OS user when running as root.
func chownPostgres(path string) error {
	if !asRoot() {
		return nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return fmt.Errorf("pgcluster: running as root needs a postgres OS user: %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return os.Chown(path, uid, gid)
}

// runAs runs a command, as the postgres OS user when running as root.
func runAs(name string, args ...string) error {
	if asRoot() && name != "cp" {
		args = append([]string{"-u", "postgres", "--", name}, args...)
		name = "runuser"
	}
	var out bytes.Buffer
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s: %w\n%s", name, strings.Join(args, " "), err, out.String())
	}
	return nil
}

// freePort returns a port on 127.0.0.1 that nothing listens on.
func freePort(tb testing.TB) int {
	tb.Helper()
	p, err := pickPort()
	if err != nil {
		tb.Fatal(err)
	}
	return p
}

// pickPort picks a free port below Linux's ephemeral range (32768-60999),
// from which a client connection could take it before the server binds.
func pickPort() (int, error) {
	for range 100 {
		p := 20000 + rand.IntN(12000)
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err == nil {
			_ = l.Close()
			return p, nil
		}
	}
	return 0, errors.New("pgcluster: no free port")
}

func tail(b []byte, lines int) []byte {
	all := bytes.Split(b, []byte("\n"))
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	return bytes.Join(all, []byte("\n"))
}
