package db_test

import "github.com/leasestore/leasestore/internal/dbtest"

// The shared helpers of internal/dbtest under the names the tests use.
var (
	newPool     = dbtest.OpenPool
	tableDigest = dbtest.TableDigest
)
