package leasing_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/internal/dbtest"
	"github.com/leasestore/leasestore/leasing"
)

// The shared helpers of internal/dbtest under the names the tests use.
var (
	adminConn          = dbtest.AdminConn
	applyRoles         = dbtest.ApplyRoles
	asUser             = dbtest.AsUser
	dropRole           = dbtest.DropRole
	execAtEnd          = dbtest.ExecAtEnd
	failureLeases      = dbtest.FailureLeases
	freshURL           = dbtest.DatabaseURL
	grantedRole        = dbtest.GrantedRole
	isArgErr           = dbtest.IsArgErr
	isPermissionDenied = dbtest.IsPermissionDenied
	loginRole          = dbtest.LoginRole
	newPool            = dbtest.OpenPool
	openStore          = dbtest.OpenStore
	queuesBoth         = dbtest.Queues
	rolesMu            = &dbtest.RolesMu
	rolesSQL           = dbtest.RolesSQL
	tableDigest        = dbtest.TableDigest
	tableOf            = dbtest.TableOf
	waitForLockWait    = dbtest.WaitForLockWait
	waitForNoLockWait  = dbtest.WaitForNoLockWait
)

// plainMessage returns an empty message that q accepts: the outbox's
// carries topic "t", which the outbox requires.
func plainMessage(q leasing.Queue) leasing.NewMessage {
	if q == leasing.Outbox {
		return leasing.NewMessage{Topic: "t"}
	}
	return leasing.NewMessage{}
}

// pick returns short in the always-on form and long under -stress.
func pick[T any](short, long T) T { return dbtest.Pick(short, long) }

// revokeMaintain takes back, on the database of url only, the MAINTAIN
// that db/roles.sql grants leasestore_processor on PostgreSQL 17 and
// later, for the tests of a role that may not VACUUM; before 17 the
// processor role has no vacuum right to take back.
func revokeMaintain(t *testing.T, url string) {
	t.Helper()
	_, err := dbtest.AdminConn(t, url).Exec(t.Context(), `DO $$
BEGIN
    IF current_setting('server_version_num')::int >= 170000 THEN
        EXECUTE 'REVOKE MAINTAIN ON inbox_messages, outbox_messages, inbox_ordering_keys, outbox_ordering_keys FROM leasestore_processor';
    END IF;
END
$$`)
	require.NoError(t, err)
}
