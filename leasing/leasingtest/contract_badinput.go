package leasingtest

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/leasestore/leasestore/leasing"
	"github.com/stretchr/testify/require"
)

// badInput checks that every malformed call fails with an *ArgumentError
// before touching the store.
func badInput(t *testing.T, b *bundle) {
	ids := b.enqueueN(3)
	held := b.claim("a", 1)[0]
	before := snapshot(t, b, ids)
	other := leasing.Outbox
	if b.q == leasing.Outbox {
		other = leasing.Inbox
	}
	fromOther := held
	fromOther.Queue = other
	otherOwner := held
	otherOwner.Owner = "b"
	unclaimed := held
	unclaimed.Generation = 0
	claim := func(r leasing.ClaimRequest) error { _, err := b.store.Claim(b.ctx, r); return err }
	good := leasing.ClaimRequest{Owner: "a", BatchSize: 1, LeaseFor: lease}
	with := func(f func(*leasing.ClaimRequest)) leasing.ClaimRequest { r := good; f(&r); return r }
	wrongField := leasing.NewMessage{Topic: "t"}
	if b.q == leasing.Outbox {
		wrongField = leasing.NewMessage{IdempotencyKey: "k"}
	}
	calls := map[string]func() error{
		"claim zero batch":     func() error { return claim(with(func(r *leasing.ClaimRequest) { r.BatchSize = 0 })) },
		"claim negative batch": func() error { return claim(with(func(r *leasing.ClaimRequest) { r.BatchSize = -1 })) },
		"claim huge batch":     func() error { return claim(with(func(r *leasing.ClaimRequest) { r.BatchSize = 1 << 30 })) },
		"claim empty owner":    func() error { return claim(with(func(r *leasing.ClaimRequest) { r.Owner = "" })) },
		"claim long owner": func() error {
			return claim(with(func(r *leasing.ClaimRequest) { r.Owner = strings.Repeat("o", 1000) }))
		},
		"claim non-UTF-8 owner": func() error { return claim(with(func(r *leasing.ClaimRequest) { r.Owner = "\xff\xfe" })) },
		"claim zero lease":      func() error { return claim(with(func(r *leasing.ClaimRequest) { r.LeaseFor = 0 })) },
		"claim negative lease":  func() error { return claim(with(func(r *leasing.ClaimRequest) { r.LeaseFor = -time.Second })) },
		"claim enormous lease":  func() error { return claim(with(func(r *leasing.ClaimRequest) { r.LeaseFor = 1 << 62 })) },
		"claim NUL in tenant":   func() error { return claim(with(func(r *leasing.ClaimRequest) { r.TenantID = "t\x00" })) },
		"claim long tenant": func() error {
			return claim(with(func(r *leasing.ClaimRequest) { r.TenantID = strings.Repeat("t", leasing.MaxTenantIDBytes+1) }))
		},
		"claim empty topic":     func() error { return claim(with(func(r *leasing.ClaimRequest) { r.Topics = []string{"a", ""} })) },
		"claim empty except":    func() error { return claim(with(func(r *leasing.ClaimRequest) { r.ExceptTopics = []string{""} })) },
		"claim duplicate topic": func() error { return claim(with(func(r *leasing.ClaimRequest) { r.Topics = []string{"a", "a"} })) },
		"claim topic in both": func() error {
			return claim(with(func(r *leasing.ClaimRequest) { r.Topics, r.ExceptTopics = []string{"a", "b"}, []string{"b"} }))
		},
		"claim too many topics": func() error {
			return claim(with(func(r *leasing.ClaimRequest) {
				for i := range leasing.MaxClaimTopics + 1 {
					r.Topics = append(r.Topics, fmt.Sprint("t", i))
				}
			}))
		},
		"claim long topic": func() error {
			return claim(with(func(r *leasing.ClaimRequest) { r.ExceptTopics = []string{strings.Repeat("t", leasing.MaxTopicBytes+1)} }))
		},
		"claim NUL in topic": func() error { return claim(with(func(r *leasing.ClaimRequest) { r.Topics = []string{"t\x00"} })) },
		"enqueue long tenant": func() error {
			_, err := b.store.Enqueue(b.ctx, leasing.NewMessage{Payload: []byte("p"), TenantID: strings.Repeat("t", leasing.MaxTenantIDBytes+1)})
			return err
		},
		"renew no leases":       func() error { _, err := b.store.Renew(b.ctx, lease); return err },
		"renew zero duration":   func() error { _, err := b.store.Renew(b.ctx, 0, held); return err },
		"renew other queue":     func() error { _, err := b.store.Renew(b.ctx, lease, fromOther); return err },
		"renew mixed owners":    func() error { _, err := b.store.Renew(b.ctx, lease, held, otherOwner); return err },
		"renew duplicate lease": func() error { _, err := b.store.Renew(b.ctx, lease, held, held); return err },
		"release nil":           func() error { _, err := b.store.Release(b.ctx, nil...); return err },
		"release other queue":   func() error { _, err := b.store.Release(b.ctx, fromOther); return err },
		"release after none":    func() error { _, err := b.store.ReleaseAfter(b.ctx); return err },
		"release after negative delay": func() error {
			_, err := b.store.ReleaseAfter(b.ctx, leasing.Failure{Lease: held, RetryAfter: -1})
			return err
		},
		"release after too long": func() error {
			_, err := b.store.ReleaseAfter(b.ctx, leasing.Failure{Lease: held, RetryAfter: leasing.MaxDelay + time.Second})
			return err
		},
		"complete unclaimed":   func() error { _, err := b.store.Complete(b.ctx, unclaimed); return err },
		"complete other queue": func() error { _, err := b.store.Complete(b.ctx, fromOther); return err },
		"fail negative delay":  func() error { _, err := b.store.Fail(b.ctx, leasing.Failure{Lease: held, RetryAfter: -1}); return err },
		"fail none":            func() error { _, err := b.store.Fail(b.ctx); return err },
		"dead-letter other":    func() error { _, err := b.store.DeadLetter(b.ctx, leasing.Failure{Lease: fromOther}); return err },
		"enqueue none":         func() error { _, err := b.store.Enqueue(b.ctx); return err },
		"enqueue payload too big": func() error {
			_, err := b.store.Enqueue(b.ctx, leasing.NewMessage{}, leasing.NewMessage{Payload: make([]byte, leasing.MaxPayloadBytes+1)})
			return err
		},
		"enqueue negative delay": func() error { _, err := b.store.Enqueue(b.ctx, leasing.NewMessage{Delay: -time.Second}); return err },
		"enqueue bad headers":    func() error { _, err := b.store.Enqueue(b.ctx, leasing.NewMessage{Headers: []byte("[1]")}); return err },
		"enqueue NUL in type":    func() error { _, err := b.store.Enqueue(b.ctx, leasing.NewMessage{Type: "a\x00b"}); return err },
		"enqueue long type": func() error {
			_, err := b.store.Enqueue(b.ctx, leasing.NewMessage{Type: strings.Repeat("t", leasing.MaxTopicBytes+1)})
			return err
		},
		"enqueue long topic": func() error {
			_, err := b.store.Enqueue(b.ctx, leasing.NewMessage{Topic: strings.Repeat("t", leasing.MaxTopicBytes+1)})
			return err
		},
		"enqueue other queue field": func() error {
			_, err := b.store.Enqueue(b.ctx, wrongField)
			return err
		},
		"requeue no ids":   func() error { _, err := b.store.Requeue(b.ctx); return err },
		"requeue dup ids":  func() error { _, err := b.store.Requeue(b.ctx, ids[0], ids[0]); return err },
		"requeue nil id":   func() error { _, err := b.store.Requeue(b.ctx, ids[0], uuid.Nil); return err },
		"purge zero age":   func() error { _, err := b.store.Purge(b.ctx, leasing.PurgeRequest{BatchSize: 1}); return err },
		"purge zero batch": func() error { _, err := b.store.Purge(b.ctx, leasing.PurgeRequest{OlderThan: time.Hour}); return err },
	}
	if cc, ok := b.store.(completeAndClaimer); ok {
		calls["complete and claim bad request"] = func() error {
			_, _, err := cc.CompleteAndClaim(b.ctx, []leasing.Lease{held}, with(func(r *leasing.ClaimRequest) { r.BatchSize = 0 }))
			return err
		}
		calls["complete and claim other queue"] = func() error {
			_, _, err := cc.CompleteAndClaim(b.ctx, []leasing.Lease{fromOther}, good)
			return err
		}
		calls["complete and claim unclaimed"] = func() error {
			_, _, err := cc.CompleteAndClaim(b.ctx, []leasing.Lease{unclaimed}, good)
			return err
		}
		calls["claim after nothing, bad owner"] = func() error {
			_, _, err := cc.CompleteAndClaim(b.ctx, nil, with(func(r *leasing.ClaimRequest) { r.Owner = "" }))
			return err
		}
	}
	if b.q == leasing.Inbox {
		calls["enqueue long idempotency key"] = func() error {
			_, err := b.store.Enqueue(b.ctx, leasing.NewMessage{Payload: []byte("p"), IdempotencyKey: strings.Repeat("k", leasing.MaxIdempotencyKeyBytes+1)})
			return err
		}
	}
	// Headers Go's JSON decoder takes and PostgreSQL's jsonb refuses.
	for _, h := range []string{`{"a":"\u0000"}`, `{"\u0000":1}`, `{"a":"\ud800"}`, `{"a":"\udc00x"}`, `{"a":"\ud83d\n"}`,
		`{"a":1e131072}`, `{"a":[1e-16384]}`, `{"a":0e-16384}`, "{\"a\":\"\xff\"}", `{} {}`} {
		calls["enqueue headers "+h] = func() error {
			_, err := b.store.Enqueue(b.ctx, leasing.NewMessage{Headers: []byte(h)})
			return err
		}
	}
	for name, call := range calls {
		err := call()
		require.ErrorIs(t, err, leasing.ErrInvalidArgument, name)
		var argErr *leasing.ArgumentError
		require.True(t, errors.As(err, &argErr), name)
	}
	require.Equal(t, before, snapshot(t, b, ids))
	// The limits themselves are accepted.
	_, err := b.store.Enqueue(b.ctx, leasing.NewMessage{Payload: make([]byte, leasing.MaxPayloadBytes)})
	require.NoError(t, err)
	atLimits := leasing.NewMessage{
		Payload: []byte("p"), TenantID: strings.Repeat("t", leasing.MaxTenantIDBytes), Type: strings.Repeat("y", leasing.MaxTopicBytes),
		Headers: []byte(`{"pair":"\ud83d\ude00","escaped":"\\u0000","big":-1e131071,"small":[1e-16383,0e200000]}`),
	}
	if b.q == leasing.Outbox {
		atLimits.Topic = strings.Repeat("o", leasing.MaxTopicBytes)
	}
	if b.q == leasing.Inbox {
		atLimits.IdempotencyKey = strings.Repeat("k", leasing.MaxIdempotencyKeyBytes)
	}
	_, err = b.store.Enqueue(b.ctx, atLimits)
	require.NoError(t, err)
	require.NoError(t, claim(with(func(r *leasing.ClaimRequest) { r.TenantID = atLimits.TenantID })))
}

// snapshot is the state of the rows ids plus the queue depth, as text.
func snapshot(t *testing.T, b *bundle, ids []uuid.UUID) string {
	t.Helper()
	var sb strings.Builder
	for _, id := range ids {
		row, err := b.store.Get(b.ctx, id)
		require.NoError(t, err)
		fmt.Fprintf(&sb, "%+v\n", row)
	}
	st, err := b.store.Stats(b.ctx)
	require.NoError(t, err)
	fmt.Fprintf(&sb, "%v %d\n", st.Depth[b.q.InFlight()], st.ExpiredLeases)
	return sb.String()
}
