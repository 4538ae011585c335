// Package brokermsg is what the broker adapters (adapters/natsjs,
// adapters/rabbitmq, adapters/kafka) share: the headers an outbox message
// travels with, the inbox message made from a broker message, and the
// inbox enqueue that tells a bad message from a failed store.
//
// The adapters are modules of their own; they import this package through
// the path rule of internal packages, so it adds nothing to the library's
// API.
package brokermsg

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/processor"
)

// The headers an adapter adds to the message's own: the outbox message's
// id, type, ordering key and tenant id, each only when set. The inbox
// consumers read them back (Incoming).
const (
	HeaderMessageID   = "Leasestore-Message-Id"
	HeaderType        = "Leasestore-Type"
	HeaderOrderingKey = "Leasestore-Ordering-Key"
	HeaderTenantID    = "Leasestore-Tenant-Id"
)

// Header is one broker header.
type Header struct{ Key, Value string }

// Outgoing returns the broker headers of m: its own headers (the JSON
// object of Message.Headers, trace context included: leasing.
// HeaderTraceParent and HeaderTraceState) in key order, a string value as
// it is and any other value as its JSON text, then HeaderMessageID,
// HeaderType, HeaderOrderingKey and HeaderTenantID when set. A key of
// m.Headers spelled as one of those four is left out: the message's field
// wins.
func Outgoing(m leasing.Message) []Header {
	var own map[string]json.RawMessage
	_ = json.Unmarshal(m.Headers, &own) // validated as an object on enqueue; anything else carries none
	hs := make([]Header, 0, len(own)+4)
	for _, k := range slices.Sorted(maps.Keys(own)) {
		if reserved(k) {
			continue
		}
		v := own[k]
		var s string
		if json.Unmarshal(v, &s) != nil {
			s = string(v)
		}
		hs = append(hs, Header{k, s})
	}
	for _, h := range [...]Header{
		{HeaderMessageID, m.ID.String()}, {HeaderType, m.Type},
		{HeaderOrderingKey, m.OrderingKey}, {HeaderTenantID, m.TenantID},
	} {
		if h.Value != "" {
			hs = append(hs, h)
		}
	}
	return hs
}

// reserved reports whether k is one of the headers Outgoing adds itself.
func reserved(k string) bool {
	switch k {
	case HeaderMessageID, HeaderType, HeaderOrderingKey, HeaderTenantID:
		return true
	}
	return false
}

// Incoming returns the inbox message for a broker message with headers and
// payload: Type, OrderingKey and TenantID from HeaderType (else
// defaultType), HeaderOrderingKey and HeaderTenantID; Headers a JSON object
// of the other headers (trace context included), the last value of a
// repeated key winning; IdempotencyKey the given key, or "sha256:" and its
// hex digest when it is longer than leasing.MaxIdempotencyKeyBytes. The
// store validates the rest when it enqueues.
func Incoming(headers []Header, payload []byte, idempotencyKey, defaultType string) leasing.NewMessage {
	m := leasing.NewMessage{Type: defaultType, Payload: payload, IdempotencyKey: idempotencyKey}
	if len(idempotencyKey) > leasing.MaxIdempotencyKeyBytes {
		sum := sha256.Sum256([]byte(idempotencyKey))
		m.IdempotencyKey = "sha256:" + hex.EncodeToString(sum[:])
	}
	own := map[string]string{}
	for _, h := range headers {
		switch h.Key {
		case HeaderMessageID:
		case HeaderType:
			m.Type = h.Value
		case HeaderOrderingKey:
			m.OrderingKey = h.Value
		case HeaderTenantID:
			m.TenantID = h.Value
		default:
			own[h.Key] = h.Value
		}
	}
	m.Headers, _ = json.Marshal(own) // strings: cannot fail
	return m
}

// Enqueuer is the inbox store's enqueue (leasing.Store.Enqueue): the
// consumers call it with the messages of one fetch.
type Enqueuer interface {
	// Enqueue adds msgs and reports those skipped as duplicates.
	Enqueue(ctx context.Context, msgs ...leasing.NewMessage) (leasing.EnqueueResult, error)
}

// Enqueue enqueues msgs, the messages of one fetch, into the inbox in one
// call and returns one error per message, in order: nil once the message
// is committed (or was there already: a duplicate), processor.Permanent
// for a message the store refuses whatever the retry (bad input, an
// ordering-key conflict), and the store's error for the others. When the
// one call is refused for bad input, each message is enqueued alone to
// find the bad ones. No message is left half enqueued: each call is one
// transaction.
func Enqueue(ctx context.Context, inbox Enqueuer, msgs []leasing.NewMessage) []error {
	errs := make([]error, len(msgs))
	if len(msgs) == 0 {
		return errs
	}
	_, err := inbox.Enqueue(ctx, msgs...)
	if err == nil {
		return errs
	}
	if !refused(err) || len(msgs) == 1 {
		for i := range errs {
			errs[i] = classify(err)
		}
		return errs
	}
	for i, m := range msgs {
		_, err := inbox.Enqueue(ctx, m)
		errs[i] = classify(err)
	}
	return errs
}

// refused reports whether err is the store refusing the messages
// themselves.
func refused(err error) bool {
	var conflict *leasing.OrderingKeyConflictError
	return errors.Is(err, leasing.ErrInvalidArgument) || errors.As(err, &conflict)
}

// classify wraps err with processor.Permanent when the store refused the
// message itself.
func classify(err error) error {
	if err != nil && refused(err) {
		return processor.Permanent(fmt.Errorf("inbox refused the message: %w", err))
	}
	return err
}

// IsPermanent reports whether err carries processor.Permanent: the
// message, not the store, failed, and no retry can succeed.
func IsPermanent(err error) bool {
	v, _ := processor.VerdictOf(err)
	return v == processor.VerdictPermanent
}
