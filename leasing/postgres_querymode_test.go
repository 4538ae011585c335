package leasing_test

import (
	"net/url"
	"testing"

	"github.com/leasestore/leasestore/internal/dbtest"
	"github.com/stretchr/testify/require"
)

// queryModes are pgx's five query exec modes, by the name the
// default_query_exec_mode connection parameter takes.
var queryModes = []string{"cache_statement", "cache_describe", "describe_exec", "exec", "simple_protocol"}

// TestPostgresContractQueryModes runs the store contract with each pgx
// query exec mode but the default as the pool's default: pools behind a transaction pooler
// use exec or simple_protocol, which know no parameter types before they
// send, so every parameter must be encodable from its Go type alone.
func TestPostgresContractQueryModes(t *testing.T) {
	t.Parallel()
	for _, mode := range queryModes {
		if mode == "cache_statement" {
			continue // pgx's default: TestPostgresContract
		}
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			runContract(t, &dbtest.RecycledDBs{Owner: t}, func(tb testing.TB, url string) string {
				return withQueryMode(tb, url, mode)
			})
		})
	}
}

// withQueryMode returns the connection URL u with default_query_exec_mode
// set to mode, one of queryModes.
func withQueryMode(tb testing.TB, u, mode string) string {
	tb.Helper()
	parsed, err := url.Parse(u)
	require.NoError(tb, err)
	q := parsed.Query()
	q.Set("default_query_exec_mode", mode)
	parsed.RawQuery = q.Encode()
	return parsed.String()
}
