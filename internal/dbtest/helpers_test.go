package dbtest_test

import "github.com/leasestore/leasestore/internal/dbtest"

// The shared helpers of internal/dbtest under the names the tests use.
var (
	adminConn = dbtest.AdminConn
	dropRole  = dbtest.DropRole
	newPool   = dbtest.OpenPool
)
