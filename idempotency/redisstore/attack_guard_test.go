// Black-box attack on idempotency.Guard over the Redis store: the scenarios
// live in internal/idemtest (RunGuardAttacks), for both stores.

package redisstore_test

import (
	"testing"

	"github.com/stormguard/stormguard/idempotency/store"
	"github.com/stormguard/stormguard/internal/idemtest"
)

func TestAttackGuard(t *testing.T) {
	idemtest.RunGuardAttacks(t, func(t *testing.T) store.Store {
		c, _ := client(t, 32)
		return newStore(t, c)
	})
}
