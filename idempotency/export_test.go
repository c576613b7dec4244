package idempotency

import (
	"time"

	"github.com/stormguard/stormguard/idempotency/store"
)

// HashKey is hashKey, for the black-box tests.
func HashKey(scope, key string) store.ID { return hashKey(scope, key) }

// SetMemoryClock makes s read the time from now. Call it before s is used.
func SetMemoryClock(s *MemoryStore, now func() time.Time) {
	s.once.Do(func() { s.setup(MemoryConfig{}) })
	s.now = now
}

// MemoryLen returns the number of keys s holds, expired ones not yet
// dropped included.
func MemoryLen(s *MemoryStore) int { return s.len() }

// MemorySweep drops every expired lock and record of s, and returns how
// many.
func MemorySweep(s *MemoryStore) int { return s.sweep() }

// MemoryShards returns the number of shards of s.
func MemoryShards(s *MemoryStore) int {
	s.once.Do(func() { s.setup(MemoryConfig{}) })
	return len(s.shards)
}
