// Leasectl operates leasestore queues on PostgreSQL: it migrates the schema,
// enqueues and claims messages, shows queue depth and one message's attempt
// history, dead-letters a message by hand, requeues dead-lettered
// messages, purges finished ones, serves queue-depth metrics, checks a
// database's health (doctor) and measures drains (bench).
//
// Usage:
//
//	leasectl [--database-url URL] <command> [flags]
//
// Run "leasectl help" for the list of commands and "leasectl <command> -h"
// for a command's flags. Exit status: 0 on success, 1 when the command
// failed, 2 for bad flags or arguments (nothing was changed).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/leasestore/leasestore/leasing"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run executes the command line args (without the program name) and returns
// the exit status. SIGINT and SIGTERM cancel the running command.
func run(args []string, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return runContext(ctx, args, stdout, stderr)
}

// command is one leasectl subcommand.
type command struct {
	name     string
	synopsis string
	summary  string
	run      func(ctx context.Context, c *cli, args []string) error
}

// commands lists the subcommands in the order usage shows them.
var commands = []command{
	{"migrate", "up|down|status|sql", "apply the schema, roll back one migration, show the schema version, or print the SQL", runMigrate},
	{"enqueue", "--queue Q [--count N] [--delay D] [--tenant T] [--type T] [--topic T] [--ordering-key K] [--payload S] [--json]", "add messages to a queue", runEnqueue},
	{"claim", "--queue Q --owner O [--batch N] [--lease D] [--tenant T] [--json]", "lease due messages to an owner and print the leases", runClaim},
	{"stats", "[--queue Q] [--json]", "queue depth by status, expired leases, oldest due age and oldest key head", runStats},
	{"get", "--queue Q --id ID [--json]", "show one message, its payload and its attempt history", runGet},
	{"list", "--queue Q [--status S] [--type T] [--error TEXT] [--older-than D] ... [--after CURSOR] [--json]", "list the messages that match filters, one page at a time", runList},
	{"bulk", "requeue|dead-letter|purge --queue Q [filters] [--dry-run] [--yes]", "requeue, dead-letter or purge every message that matches filters", runBulk},
	{"dead-letter", "--queue Q --id ID --reason TEXT [--force] [--json]", "dead-letter one message by hand (--force fences a live lease)", runDeadLetter},
	{"requeue", "--queue Q (--id ID ... | --all) [--json]", "move dead-lettered messages back to pending", runRequeue},
	{"purge", "--queue Q --older-than D [--batch N] [--include-dead-lettered]", "delete finished messages in bounded batches", runPurge},
	{"ordering", "--queue Q [--strict true|false] [--json]", "show or set strict ordering: whether a dead-lettered head keeps its key blocked", runOrdering},
	{"pause", "--queue Q (--topic T ... | --all) [--by WHO] [--json]", "stop claims of a queue's topics (inbox: message types), or of the whole queue", runPause},
	{"resume", "--queue Q (--topic T ... | --all) [--json]", "let processors claim what pause stopped, at once", runResume},
	{"serve", "[--metrics-addr ADDR] [--queue Q] [--ui]", "serve queue-depth gauges at /metrics, /healthz, /readyz, and with --ui the web console", runServe},
	{"doctor", "[--queue Q] [--json] [--batch N]", "check indexes, claim plan and cost, lease health, dead rows and vacuum", runDoctor},
	{"bench", "[--messages N] [--workers W] [--batch B] [--rounds N] [--ordering-keys K] [--json] ...", "fill a database of its own, drain it via the API and via pgbench, compare", runBench},
}

// runContext is run with the caller's context, for tests.
func runContext(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return runInput(ctx, os.Stdin, args, stdout, stderr)
}

// runInput is runContext reading confirmations from stdin.
func runInput(ctx context.Context, stdin io.Reader, args []string, stdout, stderr io.Writer) int {
	c := newCLI(stdout, stderr, os.Getenv)
	c.stdin = stdin
	global := flag.NewFlagSet("leasectl", flag.ContinueOnError)
	global.Usage = func() {}
	c.addDatabaseFlag(global)
	version := global.Bool("version", false, "print the version and exit")
	global.SetOutput(io.Discard)
	if err := global.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			c.usage(stdout)
			return 0
		}
		fmt.Fprintf(stderr, "leasectl: %v\nRun 'leasectl help' for usage.\n", err)
		return 2
	}
	rest := global.Args()
	if *version {
		if err := printVersion(stdout); err != nil {
			fmt.Fprintf(stderr, "leasectl: %v\n", err)
			return 1
		}
		return 0
	}
	if len(rest) == 0 {
		c.usage(stderr)
		return 2
	}
	name, args := rest[0], rest[1:]
	if name == "help" {
		return c.help(ctx, args)
	}
	cmd, ok := lookupCommand(name)
	if !ok {
		fmt.Fprintf(stderr, "leasectl: unknown command %q\n\n", name)
		c.usage(stderr)
		return 2
	}
	return c.exitStatus(name, cmd.run(ctx, c, args))
}

func lookupCommand(name string) (command, bool) {
	for _, cmd := range commands {
		if cmd.name == name {
			return cmd, true
		}
	}
	return command{}, false
}

// help prints the command list to stdout, or one command's flags.
func (c *cli) help(ctx context.Context, args []string) int {
	switch len(args) {
	case 0:
		c.usage(c.stdout)
		return 0
	case 1:
		cmd, ok := lookupCommand(args[0])
		if !ok {
			fmt.Fprintf(c.stderr, "leasectl help: unknown command %q\n", args[0])
			return 2
		}
		c.stderr = c.stdout // flag usage goes to stderr; asked-for help goes to stdout
		return c.exitStatus(cmd.name, cmd.run(ctx, c, []string{"-h"}))
	default:
		fmt.Fprintln(c.stderr, "usage: leasectl help [command]")
		return 2
	}
}

func (c *cli) usage(w io.Writer) {
	fmt.Fprint(w, `usage: leasectl [--database-url URL] <command> [flags]
       leasectl --version

commands:
`)
	for _, cmd := range commands {
		fmt.Fprintf(w, "  %-11s %s\n", cmd.name, cmd.summary)
	}
	fmt.Fprintf(w, `  %-11s print this list, or a command's flags

--database-url defaults to $DATABASE_URL, else %s.
It may also follow the command name. Queues are inbox and outbox.
Run "leasectl <command> -h" for a command's flags.
Exit status: 0 success, 1 failure, 2 bad flags or arguments (nothing changed).
`, "help", defaultDatabaseURL)
}

// exitStatus prints err for command name and returns the exit status:
// 0 for nil or -h, 2 for bad input, 1 for everything else.
func (c *cli) exitStatus(name string, err error) int {
	var ue *usageError
	var code exitCode
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &code):
		return int(code)
	case errors.As(err, &ue):
		fmt.Fprintf(c.stderr, "leasectl %s: %s\nRun 'leasectl %s -h' for usage.\n", name, ue.msg, name)
		return 2
	case errors.Is(err, leasing.ErrInvalidArgument):
		fmt.Fprintf(c.stderr, "leasectl %s: %v\n", name, err)
		return 2
	default:
		fmt.Fprintf(c.stderr, "leasectl %s: %v\n", name, err)
		return 1
	}
}
