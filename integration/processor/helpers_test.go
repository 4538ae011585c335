package processor_test

import (
	"testing"

	"github.com/leasestore/leasestore/internal/dbtest"
)

// The shared helpers of internal/dbtest under the names the tests use.
var (
	adminConn          = dbtest.AdminConn
	applyRoles         = dbtest.ApplyRoles
	asUser             = dbtest.AsUser
	freshURL           = dbtest.DatabaseURL
	isPermissionDenied = dbtest.IsPermissionDenied
	loginRole          = dbtest.LoginRole
	newPool            = dbtest.OpenPool
	openStore          = dbtest.OpenStore
	queuesBoth         = dbtest.Queues
	tableDigest        = dbtest.TableDigest
	tableOf            = dbtest.TableOf
)

// grantedRole is dbtest.GrantedRole plus SELECT on leasestore_paused,
// which every claim reads (migration 00015): these tests take a grant of
// the messages or keys tables away, never the pauses'. The leasing
// package's privilege tests take that one away too.
func grantedRole(tb testing.TB, url string, grants ...string) string {
	tb.Helper()
	return dbtest.GrantedRole(tb, url, append(grants, "SELECT ON leasestore_paused")...)
}
