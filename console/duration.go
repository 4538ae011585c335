package console

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// DurationForm names the form ParseDuration reads, for messages.
const DurationForm = "a duration such as 90s, 15m, 36h, 7d or 1d12h"

// ParseDuration reads a Go duration (90s, 15m, 36h) that may start with
// whole days (7d, 1d12h): a day is 24 hours.
//
// Errors: one that quotes s and names DurationForm.
func ParseDuration(s string) (time.Duration, error) {
	bad := fmt.Errorf("%q is not %s", s, DurationForm)
	days, rest, hasDays := strings.Cut(s, "d")
	var d time.Duration
	if hasDays {
		n, err := strconv.ParseUint(days, 10, 16)
		if err != nil {
			return 0, bad
		}
		d = time.Duration(n) * 24 * time.Hour
		if rest == "" {
			return d, nil
		}
	} else {
		rest = s
	}
	r, err := time.ParseDuration(rest)
	if err != nil || (hasDays && r < 0) {
		return 0, bad
	}
	return d + r, nil
}
