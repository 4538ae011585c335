// Package e2e holds what the integration suites share that is not a
// database helper (those are in internal/dbtest of the root module).
package e2e

import "time"

// Wait bounds every wait for a condition in the end-to-end suites. It is a
// timeout, not a timing assertion: conditions normally hold within
// milliseconds.
const Wait = 10 * time.Second
