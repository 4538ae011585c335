package leasing

import (
	"context"
	"maps"
	"slices"
	"strings"
)

// Pause implements Postgres.Pause in memory.
func (m *Memory) Pause(ctx context.Context, r PauseRequest) error {
	if err := r.Validate(false); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.paused == nil {
		m.paused = map[string]Pause{}
	}
	now := m.clock()
	for _, t := range r.pauseKeys() {
		if _, ok := m.paused[t]; !ok {
			m.paused[t] = Pause{Queue: m.queue, Topic: t, By: r.By, At: now}
		}
	}
	return nil
}

// Resume implements Postgres.Resume in memory (it notifies no one).
func (m *Memory) Resume(ctx context.Context, r PauseRequest) error {
	if err := r.Validate(true); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, t := range r.pauseKeys() {
		delete(m.paused, t)
	}
	return nil
}

// Paused implements Postgres.Paused in memory.
func (m *Memory) Paused(ctx context.Context) ([]Pause, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	out := slices.Collect(maps.Values(m.paused))
	slices.SortFunc(out, func(a, b Pause) int { return strings.Compare(a.Topic, b.Topic) })
	return append([]Pause{}, out...), nil
}

// isPaused reports whether a claim may not take r: its queue or its topic
// is paused. The caller holds m.mu.
func (m *Memory) isPaused(r *Row) bool {
	if len(m.paused) == 0 {
		return false
	}
	_, all := m.paused[""]
	_, topic := m.paused[m.topic(r)]
	return all || topic
}
