package main

import (
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestReadmeQuickStart fails when the Go block of the README's Quick start
// section is not main.go verbatim. With this package compiling, the README's
// Quick start compiles as written.
func TestReadmeQuickStart(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	program, err := os.ReadFile("main.go")
	require.NoError(t, err)

	block, err := quickStartBlock(string(readme))
	require.NoError(t, err)
	want := strings.Split(string(program), "\n")
	got := strings.Split(block, "\n")
	for i := range min(len(want), len(got)) {
		require.Equal(t, want[i], got[i], "README.md Quick start, line %d of the Go block differs from examples/quickstart/main.go", i+1)
	}
	require.Equal(t, len(want), len(got), "README.md Quick start: the Go block and examples/quickstart/main.go differ in length")
}

// quickStartBlock returns the content of the first ```go block of the
// "## Quick start" section of readme, ending in a newline.
func quickStartBlock(readme string) (string, error) {
	_, section, ok := strings.Cut(readme, "\n## Quick start\n")
	if !ok {
		return "", errors.New("README.md: no \"## Quick start\" section")
	}
	section, _, _ = strings.Cut(section, "\n## ")
	_, block, ok := strings.Cut(section, "\n```go\n")
	if !ok {
		return "", errors.New("README.md: no ```go block in the Quick start section")
	}
	block, _, ok = strings.Cut(block, "\n```\n")
	if !ok {
		return "", errors.New("README.md: the Quick start's ```go block is not closed")
	}
	return block + "\n", nil
}
