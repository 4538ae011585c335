package arch_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestLibraryModuleGraph builds the module graph of a program that imports
// the library's packages (db, leasing, leasing/processor) and checks that
// it holds neither the OpenTelemetry SDK nor an exporter nor the Prometheus
// client: those belong to the CLI's and the test suites' modules. It runs
// the go command on a throwaway module that points at this checkout.
func TestLibraryModuleGraph(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("runs the go command")
	}
	root, err := filepath.Abs("../..")
	require.NoError(t, err)
	dir := t.TempDir()
	write := func(name, text string) {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644))
	}
	write("go.mod", "module example.com/consumer\n\ngo 1.26.0\n\n"+
		"require github.com/leasestore/leasestore v0.0.0\n\n"+
		"replace github.com/leasestore/leasestore => "+root+"\n")
	write("main.go", `package main

import (
	"github.com/leasestore/leasestore/db"
	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/processor"
)

func main() { _, _, _ = db.MigrateUp, leasing.NewPostgres, processor.New }
`)
	goCmd, err := exec.LookPath("go")
	require.NoError(t, err, "the go command is on PATH")
	run := func(args ...string) string {
		cmd := exec.CommandContext(t.Context(), goCmd, args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "go %s:\n%s", strings.Join(args, " "), out)
		return string(out)
	}
	run("mod", "tidy")
	modules := run("list", "-m", "all")
	require.Contains(t, modules, "github.com/jackc/pgx/v5 ", "the graph was listed")
	for _, line := range strings.Split(modules, "\n") {
		path, _, _ := strings.Cut(line, " ")
		for _, banned := range []string{
			"go.opentelemetry.io/otel/sdk",
			"go.opentelemetry.io/otel/exporters/",
			"github.com/prometheus/client_golang",
		} {
			require.False(t, strings.HasPrefix(path, banned), "a program importing only the library lists %s", path)
		}
	}
}
