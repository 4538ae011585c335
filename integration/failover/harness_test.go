package failover_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/integration/internal/pgcluster"
)

// TestHarnessFailover checks the harness itself: a row committed on a
// synchronous primary is on the promoted standby, a multi-host URL with
// target_session_attrs=read-write reaches whichever node is the primary,
// and a proxy that switches backends reaches the new primary.
func TestHarnessFailover(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := pgcluster.Start(t, pgcluster.Options{Mode: pgcluster.Sync})
	proxy := pgcluster.NewProxy(t, c.Primary.Addr())

	before := connect(ctx, t, c.MultiHostURL())
	require.Equal(t, c.Primary.Port, before.PgConn().Conn().RemoteAddr().(*net.TCPAddr).Port)
	_, err := before.Exec(ctx, "CREATE TABLE harness_check (n int)")
	require.NoError(t, err)
	_, err = before.Exec(ctx, "INSERT INTO harness_check VALUES (1)")
	require.NoError(t, err)

	c.Failover("immediate")
	proxy.SwitchTo(c.Standby.Addr())
	_, err = before.Exec(ctx, "INSERT INTO harness_check VALUES (2)")
	require.Error(t, err, "the old primary is down")

	for _, url := range []string{c.MultiHostURL(), "postgres://postgres@" + proxy.Addr() + "/postgres?sslmode=disable"} {
		after := connect(ctx, t, url)
		var n int
		require.NoError(t, after.QueryRow(ctx, "SELECT count(*) FROM harness_check").Scan(&n))
		require.Equal(t, 1, n)
		var readOnly string
		require.NoError(t, after.QueryRow(ctx, "SHOW transaction_read_only").Scan(&readOnly))
		require.Equal(t, "off", readOnly)
	}
}

func connect(ctx context.Context, t *testing.T, url string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(ctx, url)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}
