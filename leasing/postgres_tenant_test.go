package leasing_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/leasingtest"
	"github.com/leasestore/leasestore/leasing/processor"
)

// Tenant scoping. The contract (Claim/TenantScoping) shows a claim bound to
// a tenant takes only that tenant's rows. Here: the leases such a claim
// returns cannot touch another tenant's rows (writes are fenced by message
// id, owner and generation), and processors bound to tenants A and B, run
// together with failures and reclaims, only ever claim, renew and write
// their own tenant's rows.
//
// Writes carry no tenant predicate: a hand-made Lease naming B's message
// with B's owner name and generation would pass the fence. Owner names from
// NewOwner (every Processor uses it) carry a random suffix, so one
// processor's leases never match another's; tenant isolation of writes
// rests on that and on the generation.

func TestTenantScoping(t *testing.T) {
	t.Parallel()

	for _, q := range queuesBoth {
		// A's leases, retargeted at B's messages (same generation, A's
		// owner), are refused for every write and renew; B's rows stay as
		// they were.
		t.Run(string(q)+"/LeasesOfAForBsRows", func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			clock := leasingtest.NewClock(leasingtest.Start)
			url := freshURL(t)
			admin := adminConn(t, url)
			a := openStore(t, url, q, leasing.PostgresOptions{Now: clock.Now})
			b := openStore(t, url, q, leasing.PostgresOptions{Now: clock.Now})
			// One call, so that the rows start at one generation (the
			// enqueueing transaction's).
			_, err := a.Enqueue(ctx, leasing.NewMessage{TenantID: "A"}, leasing.NewMessage{TenantID: "B"},
				leasing.NewMessage{TenantID: "A"}, leasing.NewMessage{TenantID: "B"})
			require.NoError(t, err)
			ownerA, ownerB := leasing.NewOwner("tenant-a"), leasing.NewOwner("tenant-b")
			leasesA, err := a.Claim(ctx, leasing.ClaimRequest{Owner: ownerA, BatchSize: 10, LeaseFor: time.Minute, TenantID: "A"})
			require.NoError(t, err)
			require.Len(t, leasesA, 2)
			leasesB, err := b.Claim(ctx, leasing.ClaimRequest{Owner: ownerB, BatchSize: 10, LeaseFor: time.Minute, TenantID: "B"})
			require.NoError(t, err)
			require.Len(t, leasesB, 2)
			for _, l := range leasesA {
				require.Equal(t, "A", l.Message.TenantID)
			}
			forged := make([]leasing.Lease, len(leasesA))
			for i, l := range leasesA {
				forged[i] = l
				forged[i].Message = leasesB[i].Message // B's message, A's owner and generation
				require.Equal(t, l.Generation, leasesB[i].Generation, "same generation: only the owner tells them apart")
			}
			before := tableDigest(t, admin)
			renew, err := a.Renew(ctx, time.Hour, forged...)
			require.NoError(t, err)
			require.Empty(t, renew.Renewed)
			fs := make([]leasing.Failure, len(forged))
			for i, l := range forged {
				fs[i] = leasing.Failure{Lease: l, Error: "from A"}
			}
			for name, write := range map[string]func() (leasing.WriteResult, error){
				"release":     func() (leasing.WriteResult, error) { return a.Release(ctx, forged...) },
				"complete":    func() (leasing.WriteResult, error) { return a.Complete(ctx, forged...) },
				"fail":        func() (leasing.WriteResult, error) { return a.Fail(ctx, fs...) },
				"dead-letter": func() (leasing.WriteResult, error) { return a.DeadLetter(ctx, fs...) },
			} {
				res, err := write()
				require.NoError(t, err, name)
				require.Equal(t, len(forged), res.Count(leasing.OutcomeLost), name)
			}
			require.Equal(t, before, tableDigest(t, admin), "A's leases changed B's rows")
			// Later, after B's leases expire: a claim bound to A still never
			// takes B's rows, and B's own leases still complete.
			clock.Advance(2 * time.Minute)
			again, err := a.Claim(ctx, leasing.ClaimRequest{Owner: ownerA, BatchSize: 10, LeaseFor: time.Minute, TenantID: "A"})
			require.NoError(t, err)
			for _, l := range again {
				require.Equal(t, "A", l.Message.TenantID)
			}
			res, err := b.Complete(ctx, leasesB...)
			require.NoError(t, err)
			require.Equal(t, 2, res.Count(leasing.OutcomeApplied), "expired but not reclaimed: B may still finish")
		})
	}

	// Processors bound to tenants A and B (two each), with failing and
	// hanging handlers and short leases: every claim, renew and write a
	// processor makes names only its tenant's messages; rows of no tenant
	// are never touched; both tenants' rows all finish, each under an
	// owner of its own tenant.
	t.Run("Processors", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		url := freshURL(t)
		admin := adminConn(t, url)
		loader, err := leasing.NewPostgres(newPool(t, url, "", 1), leasing.Inbox, leasing.PostgresOptions{})
		require.NoError(t, err)
		tenantOf := map[uuid.UUID]string{}
		var msgs []leasing.NewMessage
		for i := range 300 {
			msgs = append(msgs, leasing.NewMessage{TenantID: []string{"A", "B", ""}[i%3]})
		}
		res, err := loader.Enqueue(ctx, msgs...)
		require.NoError(t, err)
		for i, id := range res.IDs {
			tenantOf[id] = msgs[i].TenantID
		}

		var violations atomic.Int64
		var mu sync.Mutex
		var firstViolation string
		owners := map[string]string{} // owner -> tenant
		check := func(tenant, what string, ls []leasing.Lease) {
			for _, l := range ls {
				if tenantOf[l.Message.ID] != tenant || l.Message.TenantID != tenant {
					violations.Add(1)
					mu.Lock()
					if firstViolation == "" {
						firstViolation = fmt.Sprintf("processor of tenant %q %s message %s of tenant %q", tenant, what, l.Message.ID, tenantOf[l.Message.ID])
					}
					mu.Unlock()
				}
			}
		}
		var procs []*processor.Processor
		var calls atomic.Int64
		for i, tenant := range []string{"A", "A", "B", "B"} {
			pg, err := leasing.NewPostgres(newPool(t, url, "", 2), leasing.Inbox, leasing.PostgresOptions{})
			require.NoError(t, err)
			gs := &tenantCheckStore{Store: pg, check: func(what string, ls []leasing.Lease) { calls.Add(1); check(tenant, what, ls) }}
			var n atomic.Int64
			p, err := processor.New(gs, func(hctx context.Context, l leasing.Lease) error {
				switch n.Add(1) % 7 {
				case 0:
					return fmt.Errorf("tenant %s handler failed", tenant)
				case 3:
					select { // longer than the lease: renewed by the heartbeat
					case <-time.After(400 * time.Millisecond):
					case <-hctx.Done():
						return hctx.Err()
					}
				}
				return nil
			}, processor.Options{
				Owner: fmt.Sprintf("tenant-%s-%d", tenant, i), TenantID: tenant, BatchSize: 5, Concurrency: 3,
				LeaseDuration: 250 * time.Millisecond, HeartbeatInterval: 60 * time.Millisecond, PollInterval: 20 * time.Millisecond,
				RetryPolicy: processor.RetryPolicy{MaxAttempts: 3, InitialDelay: 5 * time.Millisecond, MaxDelay: 10 * time.Millisecond},
			})
			require.NoError(t, err)
			owners[p.Owner()] = tenant
			procs = append(procs, p)
			go func() { _ = p.Run(ctx) }()
		}
		require.Eventually(t, func() bool {
			var active int
			require.NoError(t, admin.QueryRow(ctx, `SELECT count(*) FROM inbox_messages
				WHERE tenant_id IS NOT NULL AND status NOT IN ('completed', 'dead_lettered')`).Scan(&active))
			return active == 0
		}, 30*time.Second, 20*time.Millisecond)
		stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		for _, p := range procs {
			require.NoError(t, p.Stop(stopCtx))
		}
		require.Zero(t, violations.Load(), firstViolation)
		require.NotZero(t, calls.Load())

		rows, err := admin.Query(ctx, "SELECT message_id, coalesce(tenant_id, ''), status, coalesce(lease_owner, ''), lease_generation FROM inbox_messages")
		require.NoError(t, err)
		defer rows.Close()
		for rows.Next() {
			var id uuid.UUID
			var tenant, status, owner string
			var gen int64
			require.NoError(t, rows.Scan(&id, &tenant, &status, &owner, &gen))
			if tenant == "" {
				require.Equal(t, "pending", status, "a row of no tenant was touched")
				require.Empty(t, owner, "a row of no tenant was claimed")
				continue
			}
			require.Contains(t, []string{"completed", "dead_lettered"}, status)
			require.Equal(t, tenant, owners[owner], "%s of tenant %s finished by %s", id, tenant, owner)
		}
		require.NoError(t, rows.Err())
	})
}

// tenantCheckStore passes every lease a processor claims, renews or writes
// to check.
type tenantCheckStore struct {
	leasing.Store
	check func(what string, ls []leasing.Lease)
}

func (s *tenantCheckStore) Claim(ctx context.Context, r leasing.ClaimRequest) ([]leasing.Lease, error) {
	ls, err := s.Store.Claim(ctx, r)
	s.check("claimed", ls)
	return ls, err
}

func (s *tenantCheckStore) Renew(ctx context.Context, d time.Duration, ls ...leasing.Lease) (leasing.RenewResult, error) {
	s.check("renewed", ls)
	return s.Store.Renew(ctx, d, ls...)
}

func (s *tenantCheckStore) Release(ctx context.Context, ls ...leasing.Lease) (leasing.WriteResult, error) {
	s.check("released", ls)
	return s.Store.Release(ctx, ls...)
}

func (s *tenantCheckStore) Complete(ctx context.Context, ls ...leasing.Lease) (leasing.WriteResult, error) {
	s.check("completed", ls)
	return s.Store.Complete(ctx, ls...)
}

func (s *tenantCheckStore) Fail(ctx context.Context, fs ...leasing.Failure) (leasing.WriteResult, error) {
	s.check("failed", failureLeases(fs))
	return s.Store.Fail(ctx, fs...)
}

func (s *tenantCheckStore) DeadLetter(ctx context.Context, fs ...leasing.Failure) (leasing.WriteResult, error) {
	s.check("dead-lettered", failureLeases(fs))
	return s.Store.DeadLetter(ctx, fs...)
}
