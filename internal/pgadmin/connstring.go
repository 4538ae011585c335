package pgadmin

import (
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// CheckScheme checks that u, when it is a URL (scheme://…), is a
// PostgreSQL one: postgres:// or postgresql://, in lower case as pgx
// requires. A
// keyword/value connection string ("host=… dbname=…") passes; pgx parses
// the rest.
//
// Errors: one naming the scheme found, never the rest of u, which may hold
// a password.
func CheckScheme(u string) error {
	scheme, _, ok := strings.Cut(u, "://")
	if !ok {
		return nil
	}
	switch scheme {
	case "postgres", "postgresql":
		return nil
	}
	if !isScheme(scheme) {
		return errors.New("scheme must be postgres:// or postgresql://")
	}
	return fmt.Errorf("scheme must be postgres:// or postgresql://, got %s://", scheme)
}

// isScheme reports whether s has the syntax of a URL scheme (RFC 3986: a
// letter, then letters, digits, +, - or .), so that printing it shows no
// user name or password.
func isScheme(s string) bool {
	if s == "" || len(s) > 32 {
		return false
	}
	for i, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z':
		case i > 0 && (r >= '0' && r <= '9' || r == '+' || r == '-' || r == '.'):
		default:
			return false
		}
	}
	return true
}

// ErrorText returns err's message, and when err holds a
// *pgconn.ConnectError, with each failed attempt listed once: with
// sslmode=prefer (pgx's default) pgx dials every address twice, with and
// without TLS, and a refused connection lists the same refusal twice. A
// single attempt left stays on the first line.
func ErrorText(err error) string {
	s := err.Error()
	var ce *pgconn.ConnectError
	if !errors.As(err, &ce) {
		return s
	}
	lines := strings.Split(s, "\n")
	out := make([]string, 1, len(lines))
	out[0] = lines[0]
	seen := map[string]bool{}
	for _, l := range lines[1:] {
		if strings.HasPrefix(l, "\t") {
			if seen[l] {
				continue
			}
			seen[l] = true
		}
		out = append(out, l)
	}
	if len(out) == 2 && strings.HasSuffix(out[0], ":") && strings.HasPrefix(out[1], "\t") {
		return out[0] + " " + strings.TrimPrefix(out[1], "\t")
	}
	return strings.Join(out, "\n")
}
