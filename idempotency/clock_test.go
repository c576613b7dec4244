package idempotency_test

import (
	"github.com/stormguard/stormguard/idempotency"
	"sync"
	"time"
)

// fakeClock is a manually advanced clock, safe for concurrent use.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// newClocked returns a memory store with cfg that reads the time from now.
func newClocked(cfg idempotency.MemoryConfig, now func() time.Time) (*idempotency.MemoryStore, error) {
	s, err := idempotency.NewMemoryStore(cfg)
	if err == nil {
		idempotency.SetMemoryClock(s, now)
	}
	return s, err
}
