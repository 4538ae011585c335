package main

import (
	"context"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/internal/dbtest"
)

// startServe runs "leasectl serve args" until the test ends and returns
// the URLs it prints (metrics first, then the console's).
func startServe(t *testing.T, args ...string) []string {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	var stdout, stderr syncBuffer
	exited := make(chan int, 1)
	go func() { exited <- runContext(ctx, append([]string{"serve"}, args...), &stdout, &stderr) }()
	t.Cleanup(func() {
		cancel()
		select {
		case code := <-exited:
			require.Equal(t, 0, code, stderr.String())
		case <-time.After(10 * time.Second):
			t.Error("serve did not stop")
		}
	})
	want := 1
	for _, a := range args {
		if a == "--ui" {
			want = 2
		}
	}
	urlRE := regexp.MustCompile(`http://\S+/`)
	var urls []string
	require.Eventually(t, func() bool {
		urls = urlRE.FindAllString(stdout.String(), -1)
		return len(urls) == want
	}, 10*time.Second, 10*time.Millisecond, "stderr: %s", &stderr)
	return urls
}

// fetch GETs u with the headers and returns the status and body.
func fetch(t *testing.T, u string, header ...string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, u, nil)
	require.NoError(t, err)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(body)
}

func TestServeHealthAndReadiness(t *testing.T) {
	t.Parallel()
	urls := startServe(t, "--metrics-addr", "127.0.0.1:0", "--database-url", dbtest.DatabaseURL(t))
	code, body := fetch(t, urls[0]+"healthz")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "ok\n", body)
	code, body = fetch(t, urls[0]+"readyz")
	require.Equal(t, http.StatusOK, code, body)

	// A database never migrated: alive, not ready, and says why.
	urls = startServe(t, "--metrics-addr", "127.0.0.1:0", "--database-url", dbtest.NewEmptyDatabase(t))
	code, _ = fetch(t, urls[0]+"healthz")
	require.Equal(t, http.StatusOK, code)
	code, body = fetch(t, urls[0]+"readyz")
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Contains(t, body, "not ready: inbox")
}

func TestServeUI(t *testing.T) {
	t.Parallel()
	url := dbtest.DatabaseURL(t)
	requireOK(t, "enqueue", "--queue", "inbox", "--count", "2", "--database-url", url)

	// Localhost: no token needed; read-only by default.
	urls := startServe(t, "--metrics-addr", "127.0.0.1:0", "--ui", "--ui-addr", "127.0.0.1:0", "--ui-sample", "1s", "--database-url", url)
	code, body := fetch(t, urls[1])
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, "Read-only")
	// The console samples while serve runs (goleak in TestMain checks it
	// stops with serve).
	require.Eventually(t, func() bool {
		_, body := fetch(t, urls[1])
		return strings.Contains(body, "since this console started, sampled every 1s") && strings.Contains(body, "now 2, max 2")
	}, 10*time.Second, 50*time.Millisecond)
	resp, err := http.PostForm(urls[1]+"act", map[string][]string{"action": {"purge"}, "queue": {"inbox"}})
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusForbidden, resp.StatusCode)

	// With a token: refused without it, served with it (bearer or basic).
	urls = startServe(t, "--metrics-addr", "127.0.0.1:0", "--ui", "--ui-addr", "127.0.0.1:0", "--allow-writes",
		"--ui-token", "s3cret", "--database-url", url)
	code, _ = fetch(t, urls[1])
	require.Equal(t, http.StatusUnauthorized, code)
	code, _ = fetch(t, urls[1], "Authorization", "Bearer wrong")
	require.Equal(t, http.StatusUnauthorized, code)
	code, body = fetch(t, urls[1]+"messages?queue=inbox", "Authorization", "Bearer s3cret")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "confirm?action=purge")
	code, _ = fetch(t, urls[1], "Authorization", "Basic b3BzOnMzY3JldA==") // ops:s3cret
	require.Equal(t, http.StatusOK, code)
}

func TestServeUIBadInput(t *testing.T) {
	t.Parallel()
	url := dbtest.DatabaseURL(t)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--ui", "--ui-addr", "0.0.0.0:0"}, "listens beyond this machine: give --ui-token"},
		{[]string{"--ui", "--ui-addr", ":8080"}, "listens beyond this machine"},
		{[]string{"--ui", "--ui-addr", "nope"}, "--ui-addr must be host:port"},
		{[]string{"--ui", "--ui-sample", "10ms"}, "--ui-sample must be at least 1s"},
		{[]string{"--allow-writes"}, "--allow-writes needs --ui"},
	} {
		r := leasectl(t, append(append([]string{"serve", "--metrics-addr", "127.0.0.1:0"}, c.args...), "--database-url", url)...)
		require.Equal(t, 2, r.code, "%v: %s", c.args, r.stderr)
		require.Contains(t, r.stderr, c.want)
	}
}
