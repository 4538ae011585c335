package brokermsg_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/leasestore/leasestore/internal/brokermsg"
	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/processor"
)

// Outgoing then Incoming carries the type, ordering key, tenant and the
// message's own headers (trace context included) to the inbox message.
func TestOutgoingIncomingRoundTrip(t *testing.T) {
	m := leasing.Message{ID: uuid.New(), Type: "order.placed", OrderingKey: "order-7", TenantID: "acme",
		Headers: json.RawMessage(`{"traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01","n":1,"Leasestore-Type":"spoofed"}`)}
	hs := brokermsg.Outgoing(m)
	got := map[string]string{}
	for _, h := range hs {
		got[h.Key] = h.Value
	}
	want := map[string]string{
		leasing.HeaderTraceParent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "n": "1",
		brokermsg.HeaderMessageID: m.ID.String(), brokermsg.HeaderType: "order.placed",
		brokermsg.HeaderOrderingKey: "order-7", brokermsg.HeaderTenantID: "acme",
	}
	if len(got) != len(want) {
		t.Fatalf("Outgoing = %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("header %s = %q, want %q", k, got[k], v)
		}
	}

	in := brokermsg.Incoming(hs, []byte("p"), m.ID.String(), "subject")
	if in.Type != "order.placed" || in.OrderingKey != "order-7" || in.TenantID != "acme" || in.IdempotencyKey != m.ID.String() {
		t.Fatalf("Incoming = %+v", in)
	}
	var own map[string]string
	if err := json.Unmarshal(in.Headers, &own); err != nil || len(own) != 2 || own["n"] != "1" || own[leasing.HeaderTraceParent] == "" {
		t.Fatalf("Incoming headers %s (%v), want traceparent and n only", in.Headers, err)
	}
	if in := brokermsg.Incoming(nil, nil, strings.Repeat("k", 300), "subject"); in.Type != "subject" ||
		!strings.HasPrefix(in.IdempotencyKey, "sha256:") || len(in.IdempotencyKey) > leasing.MaxIdempotencyKeyBytes {
		t.Fatalf("Incoming without headers, long key = %+v", in)
	}
}

// A batch the inbox refuses for one bad message enqueues the others and
// marks only that one permanent; a store failure is returned as it is,
// for every message.
func TestEnqueueFindsTheBadMessage(t *testing.T) {
	ctx := context.Background()
	inbox, err := leasing.NewMemory(leasing.Inbox, leasing.MemoryOptions{})
	if err != nil {
		t.Fatal(err)
	}
	msgs := []leasing.NewMessage{
		{IdempotencyKey: "a", Payload: []byte("1")},
		{IdempotencyKey: "b", Topic: "an outbox field"},
		{IdempotencyKey: "c", Payload: []byte("3")},
	}
	errs := brokermsg.Enqueue(ctx, inbox, msgs)
	if errs[0] != nil || errs[2] != nil || !brokermsg.IsPermanent(errs[1]) || !errors.Is(errs[1], leasing.ErrInvalidArgument) {
		t.Fatalf("Enqueue = %v, want only the second permanent", errs)
	}
	if st, _ := inbox.Stats(ctx); st.Depth[leasing.StatusPending] != 2 {
		t.Fatalf("inbox holds %v, want the two good messages", st.Depth)
	}
	if errs := brokermsg.Enqueue(ctx, inbox, msgs[:1]); errs[0] != nil {
		t.Fatalf("a duplicate: %v, want nil", errs[0])
	}

	down := errors.New("connection refused")
	for i, err := range brokermsg.Enqueue(ctx, failing{down}, msgs) {
		if !errors.Is(err, down) || brokermsg.IsPermanent(err) {
			t.Fatalf("message %d: %v, want the store's error, not permanent", i, err)
		}
	}
	if v, _ := processor.VerdictOf(errs[0]); v != processor.VerdictRetry {
		t.Fatal("nil carries a verdict")
	}
}

type failing struct{ err error }

func (f failing) Enqueue(context.Context, ...leasing.NewMessage) (leasing.EnqueueResult, error) {
	return leasing.EnqueueResult{}, f.err
}
