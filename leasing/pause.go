package leasing

import "time"

// PauseRequest names what Pause pauses, or Resume resumes, on a store's
// queue: the whole queue, or topics. A topic is the outbox's
// NewMessage.Topic, the inbox's NewMessage.Type, as in
// ClaimRequest.Topics.
type PauseRequest struct {
	// WholeQueue pauses the whole queue: no claim takes any of its
	// messages, nor reclaims an expired lease. Topics must then be empty.
	WholeQueue bool
	// Topics, without WholeQueue, are the topics to pause: 1..
	// MaxClaimTopics, each 1..MaxTopicBytes bytes of UTF-8 without NUL,
	// none twice. A topic may be paused before any message of it exists.
	// Messages of the empty topic pause only with the whole queue.
	Topics []string
	// By names who pauses, 1..MaxOwnerBytes bytes of UTF-8 without NUL,
	// shown by Paused (leasectl uses user@host). Resume ignores it.
	By string
}

// Pause is one pause in place (Paused).
type Pause struct {
	// Queue is the paused queue.
	Queue Queue
	// Topic is the paused topic (message type on the inbox); empty when
	// the whole queue is paused.
	Topic string
	// By is who paused it (PauseRequest.By).
	By string
	// At is when, by the store's clock (the database's for Postgres).
	At time.Time
}

// Validate returns nil when r can pause (resume false) or resume (true).
//
// Errors: an *ArgumentError naming the first bad field.
func (r PauseRequest) Validate(resume bool) error {
	if r.WholeQueue && len(r.Topics) > 0 {
		return argumentError("topics", "must be empty when the whole queue is paused, got %d", len(r.Topics))
	}
	if !r.WholeQueue && len(r.Topics) == 0 {
		return argumentError("topics", "must name a topic, or set WholeQueue")
	}
	if err := validateTopics("topics", r.Topics); err != nil {
		return err
	}
	if !resume {
		if err := validateOwner(r.By); err != nil {
			return argumentError("by", "%s", err.(*ArgumentError).Reason)
		}
	}
	return nil
}

// pauseKeys returns the topics r stores: "" for the whole queue.
func (r PauseRequest) pauseKeys() []string {
	if r.WholeQueue {
		return []string{""}
	}
	return r.Topics
}
