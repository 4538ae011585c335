package doctor

import (
	"context"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/leasestore/leasestore/gen"
	"github.com/leasestore/leasestore/leasing"
)

// ReplicationReport is the replication the connected server shows
// (pg_stat_replication, synchronous_standby_names, synchronous_commit).
type ReplicationReport struct {
	// InRecovery is true on a standby; the other fields are then the
	// standby's own and not checked.
	InRecovery bool `json:"in_recovery"`
	// Standbys counts the streaming standbys; SynchronousStandbys those a
	// commit waits for; HiddenStandbys those whose state the role may not
	// read (grant pg_read_all_stats to see it).
	Standbys            int64 `json:"standbys"`
	SynchronousStandbys int64 `json:"synchronous_standbys"`
	HiddenStandbys      int64 `json:"hidden_standbys"`
	// SynchronousStandbyNames and SynchronousCommit are the settings as the
	// connected role and database see them.
	SynchronousStandbyNames string `json:"synchronous_standby_names"`
	SynchronousCommit       string `json:"synchronous_commit"`
}

// checkReplication reads the server's replication into rep and warns when
// the inbox is checked and a standby streams but commits do not wait for
// one: a failover to it loses the last commits, among them inbox messages
// whose broker was told they were accepted (docs/high-availability.md).
// A server with no standby in pg_stat_replication is not warned about:
// replication it cannot see (a managed service's storage-level standby)
// may still be synchronous.
func checkReplication(ctx context.Context, pool *pgxpool.Pool, opts Options, rep *Report) error {
	r, err := gen.New().DiagnosticsReplication(ctx, pool)
	if err != nil {
		return fmt.Errorf("doctor: replication: %w", err)
	}
	rep.Replication = ReplicationReport{
		InRecovery: r.InRecovery, Standbys: r.Standbys, SynchronousStandbys: r.SynchronousStandbys,
		HiddenStandbys: r.HiddenStandbys, SynchronousStandbyNames: r.SynchronousStandbyNames,
		SynchronousCommit: r.SynchronousCommit,
	}
	if r.InRecovery || r.Standbys == 0 || !slices.Contains(opts.Queues, leasing.Inbox) {
		return nil
	}
	n := notes{&rep.Problems, &rep.Warnings}
	switch {
	case r.SynchronousStandbyNames == "":
		n.warn(msgInboxAsyncReplication, r.Standbys)
	case r.SynchronousCommit == "off" || r.SynchronousCommit == "local":
		n.warn(msgInboxLocalCommit, r.SynchronousCommit, r.SynchronousStandbyNames)
	case r.SynchronousStandbys == 0 && r.HiddenStandbys == 0:
		n.warn(msgInboxNoSyncStandby, r.SynchronousStandbyNames, r.Standbys)
	}
	return nil
}
