package main

import (
	"crypto/subtle"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/leasestore/leasestore/console"
	"github.com/leasestore/leasestore/leasing"
)

// checkUIAddr checks --ui-addr: [host]:port, and a token when the host is
// not a loopback address (an empty host listens everywhere).
func checkUIAddr(addr, token string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil || port == "" {
		return usagef("--ui-addr must be host:port, e.g. 127.0.0.1:8080, got %q", addr)
	}
	if token == "" && !isLoopback(host) {
		return usagef("--ui-addr %q listens beyond this machine: give --ui-token (or $LEASECTL_UI_TOKEN), or listen on 127.0.0.1", addr)
	}
	return nil
}

// isLoopback reports whether host names only this machine.
func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// consoleHandler is the console over stores (sampling every sampleEvery
// once Run), and its handler: behind the token when one is given, as
// "Authorization: Bearer <token>" or as the basic-auth password (any user
// name, logged in the audit lines).
func consoleHandler(c *cli, stores []*leasing.Postgres, readOnly bool, token string, sampleEvery time.Duration) (*console.Console, http.Handler, error) {
	logger := slog.New(slog.NewTextHandler(c.stderr, nil))
	con, err := console.New(console.Options{ReadOnly: readOnly, Logger: logger, SampleEvery: sampleEvery, User: func(r *http.Request) string {
		if user, _, ok := r.BasicAuth(); ok {
			return user
		}
		return "token"
	}}, stores...)
	if err != nil || token == "" {
		return con, con, err
	}
	return con, requireToken(token, con), nil
}

// requireToken lets through the requests that carry token, and asks the
// others for basic auth.
func requireToken(token string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		given := ""
		if _, pass, ok := r.BasicAuth(); ok {
			given = pass
		} else if b, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
			given = b
		}
		if subtle.ConstantTimeCompare([]byte(given), []byte(token)) != 1 {
			w.Header().Set("WWW-Authenticate", `Basic realm="leasestore console"`)
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}
