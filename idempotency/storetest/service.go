package storetest

import (
	"os"
	"testing"
)

// requireServicesEnv names the environment variable that, set to "1", turns
// a store test whose server is not configured into a failure instead of a
// skip.
const requireServicesEnv = "STORMGUARD_REQUIRE_SERVICES"

// ServiceAddress returns the address of a store's server from the
// environment variable env. When env is empty it skips tb with a message
// naming the variable and an example value, or fails tb if
// STORMGUARD_REQUIRE_SERVICES is "1": CI sets it, so that a missing server
// can never pass by skipping. service names the server in the messages
// (e.g. "PostgreSQL").
func ServiceAddress(tb testing.TB, env, service, example string) string {
	tb.Helper()
	addr := os.Getenv(env)
	if addr == "" {
		if os.Getenv(requireServicesEnv) == "1" {
			tb.Fatalf("%s is not set and %s=1: %s store tests need a server", env, requireServicesEnv, service)
		}
		tb.Skipf("%s store tests skipped: set %s (e.g. %s)", service, env, example)
	}
	return addr
}
