package db

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestRequirements: every embedded migration is required, in version
// order, with the indexes it creates; the primary keys count as indexes.
func TestRequirements(t *testing.T) {
	reqs, err := Requirements()
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(reqs), 5)
	names := map[int64]string{}
	indexes := map[string]string{}
	for i, r := range reqs {
		if i > 0 {
			require.Greater(t, r.Version, reqs[i-1].Version)
		}
		names[r.Version] = r.Name
		for _, ix := range r.Indexes {
			indexes[ix.Name] = ix.Table
		}
	}
	require.Equal(t, "00001_create_messages", names[1])
	require.Equal(t, "00005_lease_expiry_idx", names[5])
	for _, table := range []string{"inbox_messages", "outbox_messages"} {
		for _, suffix := range []string{"_pkey", "_ready_idx", "_inflight_idx", "_tenant_ready_idx", "_tenant_inflight_idx", "_expiry_idx"} {
			require.Equal(t, table, indexes[table+suffix], table+suffix)
		}
	}
	require.Equal(t, "inbox_messages", indexes["inbox_messages_idempotency_key_idx"])
	require.Equal(t, []RequiredIndex{{Name: "inbox_messages_expiry_idx", Table: "inbox_messages"}, {Name: "outbox_messages_expiry_idx", Table: "outbox_messages"}}, reqs[4].Indexes)
}

func TestRequirementsParsing(t *testing.T) {
	up := upPart(`-- +goose NO TRANSACTION
-- +goose Up
-- CREATE INDEX commented_idx ON t (a);
CREATE TABLE t (id int PRIMARY KEY, a int);
CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS t_a_idx
    ON t (a);
create index t_b_idx on only t (b);
DROP INDEX CONCURRENTLY IF EXISTS old_idx;
-- +goose Down
DROP INDEX t_a_idx;
CREATE INDEX down_idx ON t (a);`)
	require.Equal(t, []RequiredIndex{{"t_pkey", "t"}, {"t_a_idx", "t"}, {"t_b_idx", "t"}}, createdIndexes(up))
	require.Equal(t, []string{"old_idx"}, droppedIndexes(up))
}
