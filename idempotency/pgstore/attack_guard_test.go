// Black-box attack on idempotency.Guard over the PostgreSQL store: the scenarios
// live in internal/idemtest (RunGuardAttacks), for both stores.

package pgstore_test

import (
	"testing"

	"github.com/stormguard/stormguard/idempotency/store"
	"github.com/stormguard/stormguard/internal/idemtest"
)

func TestAttackGuard(t *testing.T) {
	idemtest.RunGuardAttacks(t, func(t *testing.T) store.Store {
		p, _ := pool(t, 32)
		return newStore(t, p)
	})
}
