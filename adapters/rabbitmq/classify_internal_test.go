package rabbitmq

import (
	"context"
	"testing"

	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/leasestore/leasestore/internal/brokertest"
	"github.com/leasestore/leasestore/leasing"
	"github.com/leasestore/leasestore/leasing/processor"
)

// A channel the broker closed for a message above max_message_size makes
// that message permanent, and the batch's others unavailable; a missing
// exchange is permanent; any other close is unavailable. (The shared test
// broker's max_message_size cannot be lowered, so the close is built
// here, with RabbitMQ's reason text.)
func TestClassifyChannelClose(t *testing.T) {
	big := leasing.Message{ID: uuid.New(), Payload: make([]byte, 2000)}
	small := leasing.Message{ID: uuid.New(), Payload: []byte("x")}
	closed := func(code int, reason string) *channel {
		c := &channel{closing: make(chan *amqp.Error, 1)}
		c.closing <- &amqp.Error{Code: code, Reason: reason}
		return c
	}
	tooLarge := "PRECONDITION_FAILED - message size 2000 is larger than configured max size 1000"
	for name, c := range map[string]struct {
		ch   *channel
		msg  leasing.Message
		want processor.Verdict
	}{
		"the large message":      {closed(amqp.PreconditionFailed, tooLarge), big, processor.VerdictPermanent},
		"another of the batch":   {closed(amqp.PreconditionFailed, tooLarge), small, processor.VerdictUnavailable},
		"no exchange":            {closed(amqp.NotFound, "NOT_FOUND - no exchange 'x' in vhost '/'"), small, processor.VerdictPermanent},
		"connection forced":      {closed(amqp.ConnectionForced, "CONNECTION_FORCED - broker shutdown"), small, processor.VerdictUnavailable},
		"closed by this process": {&channel{closing: make(chan *amqp.Error)}, small, processor.VerdictUnavailable},
	} {
		if got := brokertest.Verdict(c.ch.classify(context.Background(), c.msg, errNack)); got != c.want {
			t.Errorf("%s: %s, want %s", name, got, c.want)
		}
	}
}
