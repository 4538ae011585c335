package leasing_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/internal/dbtest"
	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/leasingtest"
)

// processorRoleStore is a store that runs as leasestore_processor, except
// Purge: purge is an operator action, so it first checks that the
// processor role is refused and then purges as a leasestore_operator login.
type processorRoleStore struct {
	*leasing.Postgres
	operator *leasing.Postgres
	tb       testing.TB
}

func (s *processorRoleStore) Purge(ctx context.Context, r leasing.PurgeRequest) (int, error) {
	n, err := s.Postgres.Purge(ctx, r)
	if isArgErr(err) {
		return n, err
	}
	if !isPermissionDenied(err) {
		s.tb.Errorf("Purge as leasestore_processor: want permission denied, got n=%d err=%v", n, err)
	}
	return s.operator.Purge(ctx, r)
}

// SetStrictOrdering is an operator action too: refused to the processor
// role, then set as a leasestore_operator login.
func (s *processorRoleStore) SetStrictOrdering(ctx context.Context, strict bool) error {
	if err := s.Postgres.SetStrictOrdering(ctx, strict); !isPermissionDenied(err) {
		s.tb.Errorf("SetStrictOrdering as leasestore_processor: want permission denied, got %v", err)
	}
	return s.operator.SetStrictOrdering(ctx, strict)
}

// Pause is an operator action: refused to the processor role, then done
// as a leasestore_operator login.
func (s *processorRoleStore) Pause(ctx context.Context, r leasing.PauseRequest) error {
	if err := s.Postgres.Pause(ctx, r); isArgErr(err) {
		return err
	} else if !isPermissionDenied(err) {
		s.tb.Errorf("Pause as leasestore_processor: want permission denied, got %v", err)
	}
	return s.operator.Pause(ctx, r)
}

// Resume is an operator action, as Pause.
func (s *processorRoleStore) Resume(ctx context.Context, r leasing.PauseRequest) error {
	if err := s.Postgres.Resume(ctx, r); isArgErr(err) {
		return err
	} else if !isPermissionDenied(err) {
		s.tb.Errorf("Resume as leasestore_processor: want permission denied, got %v", err)
	}
	return s.operator.Resume(ctx, r)
}

// TestRolesContract runs the whole store contract with every store
// connecting as a login role whose only privileges come from
// leasestore_processor (db/roles.sql); purges go through a
// leasestore_operator login after checking the processor is refused.
func TestRolesContract(t *testing.T) {
	t.Parallel()
	admin := dbtest.DatabaseURL(t)
	applyRoles(t, admin) // creates the cluster-wide roles once, before the parallel cases
	processor := loginRole(t, admin, "leasestore_processor")
	operator := loginRole(t, admin, "leasestore_operator")
	dbs := &dbtest.RecycledDBs{Owner: t, Init: applyRoles}
	leasingtest.Run(t, func(t *testing.T) leasingtest.Env {
		url := dbs.Get(t)
		clock := leasingtest.NewClock(leasingtest.Start)
		opts := leasing.PostgresOptions{Now: clock.Now}
		return leasingtest.Env{
			Clock: clock,
			Open: func(tb testing.TB, q leasing.Queue) leasing.Store {
				return &processorRoleStore{
					Postgres: dbs.OpenStore(tb, asUser(tb, url, processor), q, opts),
					operator: dbs.OpenStore(tb, asUser(tb, url, operator), q, opts),
					tb:       tb,
				}
			},
		}
	})
}

// TestRolesPrivileges checks what the roles may not do, and that rerunning
// db/roles.sql converges on the same grants.
func TestRolesPrivileges(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin := dbtest.DatabaseURL(t)
	applyRoles(t, admin)
	processor := adminConn(t, asUser(t, admin, loginRole(t, admin, "leasestore_processor")))
	operator := adminConn(t, asUser(t, admin, loginRole(t, admin, "leasestore_operator")))
	superuser := adminConn(t, admin)

	store, err := leasing.NewPostgres(newPool(t, admin, "", 1), leasing.Inbox, leasing.PostgresOptions{})
	require.NoError(t, err)
	_, err = store.Enqueue(ctx, leasing.NewMessage{TenantID: "a"})
	require.NoError(t, err)
	before := tableDigest(t, superuser)

	denied := func(conn *pgx.Conn, who, sql string) {
		t.Helper()
		_, err := conn.Exec(ctx, sql)
		require.True(t, isPermissionDenied(err), "%s: %q: want permission denied (42501), got %v", who, sql, err)
	}
	for _, table := range []string{"inbox_messages", "outbox_messages"} {
		denied(processor, "processor", "DELETE FROM "+table)
		denied(processor, "processor", "TRUNCATE "+table)
		denied(processor, "processor", "ALTER TABLE "+table+" ADD COLUMN evil integer")
		denied(processor, "processor", "ALTER TABLE "+table+" DISABLE TRIGGER ALL")
		denied(processor, "processor", "DROP TABLE "+table)
		denied(processor, "processor", "CREATE TRIGGER evil BEFORE UPDATE ON "+table+" FOR EACH ROW EXECUTE FUNCTION leasestore_notify_work()")
		denied(processor, "processor", "UPDATE "+table+" SET payload = 'x'")
		denied(processor, "processor", "UPDATE "+table+" SET tenant_id = 'b'")
		denied(processor, "processor", "UPDATE "+table+" SET message_id = gen_random_uuid()")
		denied(processor, "processor", "UPDATE "+table+" SET created_at = now()")
		denied(operator, "operator", "TRUNCATE "+table)
		denied(operator, "operator", "ALTER TABLE "+table+" ADD COLUMN evil integer")
		denied(operator, "operator", "DROP TABLE "+table)
	}
	denied(processor, "processor", "SELECT * FROM leasestore_db_version")
	denied(processor, "processor", "CREATE TABLE public.evil (id int)")
	// GRANT without the grant option only warns; it must grant nothing.
	_, err = processor.Exec(ctx, "GRANT DELETE, TRUNCATE ON inbox_messages TO PUBLIC")
	require.NoError(t, err)
	denied(processor, "processor", "DELETE FROM inbox_messages")
	require.Equal(t, before, tableDigest(t, superuser), "refused statements changed rows")

	// The operator may purge.
	_, err = operator.Exec(ctx, "DELETE FROM inbox_messages WHERE false")
	require.NoError(t, err)

	// A rerun converges: grants added by hand in between are revoked again.
	grants := func() string {
		var g string
		err := superuser.QueryRow(ctx, `
			SELECT string_agg(x, ' ' ORDER BY x) FROM (
			    SELECT grantee || ':' || table_name || ':' || privilege_type AS x
			    FROM information_schema.role_table_grants
			    WHERE grantee IN ('leasestore_processor', 'leasestore_operator')
			    UNION ALL
			    SELECT grantee || ':' || table_name || '.' || column_name || ':' || privilege_type
			    FROM information_schema.column_privileges
			    WHERE grantee IN ('leasestore_processor', 'leasestore_operator')
			) AS g`).Scan(&g)
		require.NoError(t, err)
		return g
	}
	first := grants()
	require.Contains(t, first, "leasestore_processor:inbox_messages.lease_generation:UPDATE")
	require.NotContains(t, first, "leasestore_processor:inbox_messages.payload:UPDATE")
	require.NotContains(t, first, "leasestore_processor:inbox_messages:DELETE")
	require.Contains(t, first, "leasestore_operator:inbox_messages:DELETE")
	_, err = superuser.Exec(ctx, "GRANT DELETE, UPDATE ON inbox_messages TO leasestore_processor")
	require.NoError(t, err)
	applyRoles(t, admin)
	require.Equal(t, first, grants())
	applyRoles(t, admin)
	require.Equal(t, first, grants())
}
