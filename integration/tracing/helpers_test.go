package tracing_test

import "github.com/leasestore/leasestore/integration/internal/e2e"

// e2eWait bounds every wait for a condition (e2e.Wait).
const e2eWait = e2e.Wait
