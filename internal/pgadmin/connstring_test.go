package pgadmin

import (
	"errors"
	"testing"
)

func TestCheckScheme(t *testing.T) {
	t.Parallel()
	for u, want := range map[string]string{
		"postgres://u:p@h/d":        "",
		"postgresql://u@h/d":        "",
		"host=h user=u password=p":  "",
		"mysql://root:pw@db:3306/a": "scheme must be postgres:// or postgresql://, got mysql://",
		"POSTGRES://u@h/d":          "scheme must be postgres:// or postgresql://, got POSTGRES://",
		"root:pw@db://a":            "scheme must be postgres:// or postgresql://",
		"://h/d":                    "scheme must be postgres:// or postgresql://",
	} {
		err := CheckScheme(u)
		if got := errText(err); got != want {
			t.Errorf("CheckScheme(%q) = %q, want %q", u, got, want)
		}
	}
}

func TestErrorTextPassesOtherErrors(t *testing.T) {
	t.Parallel()
	err := errors.New("a\n\tb\n\tb")
	if got := ErrorText(err); got != err.Error() {
		t.Errorf("ErrorText changed an error that is no ConnectError: %q", got)
	}
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
