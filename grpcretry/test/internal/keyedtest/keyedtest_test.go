package keyedtest_test

import (
	"strings"
	"testing"

	testpb "google.golang.org/grpc/interop/grpc_testing"

	"github.com/stormguard/stormguard/grpcretry"
	"github.com/stormguard/stormguard/grpcretry/test/internal/keyedtest"
	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/idempotency/store"
)

func memoryStores(t *testing.T) []store.Store {
	t.Helper()
	s, err := idempotency.NewMemoryStore(idempotency.MemoryConfig{})
	if err != nil {
		t.Fatal(err)
	}
	return []store.Store{s, s}
}

// TestHarnessCatchesDuplicates: with the payments method left unguarded
// (the interceptor guards another one), the lossy network makes the
// retrying client apply payments twice, and the verdict says so.
func TestHarnessCatchesDuplicates(t *testing.T) {
	res, err := keyedtest.Run(t.Context(), keyedtest.Config{
		Stores:      memoryStores(t),
		Interceptor: []grpcretry.IdempotencyOption{grpcretry.WithKeyMethods(testpb.TestService_EmptyCall_FullMethodName)},
		Payments:    500,
	})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	t.Logf("unguarded:\n%v", res)
	if err := res.Err(); res.Duplicates == 0 || err == nil || !strings.Contains(err.Error(), "duplicates") {
		t.Fatalf("unguarded payments: %d duplicates, verdict %v; want duplicates, and a verdict that names them", res.Duplicates, err)
	}
}

// TestHarnessWithoutFaults: without faults nothing is retried or
// replayed, and the run passes.
func TestHarnessWithoutFaults(t *testing.T) {
	res := keyedtest.RunTest(t, keyedtest.Config{Stores: memoryStores(t), Payments: 300, ResetRate: -1, CutRate: -1})
	if res.Resets != 0 || res.Cuts != 0 || res.Replays != 0 || res.Calls != 300 || res.Attempts != 300 {
		t.Fatalf("without faults: resets %d, cuts %d, replays %d, calls %d, attempts %d; want 0, 0, 0, 300, 300", res.Resets, res.Cuts, res.Replays, res.Calls, res.Attempts)
	}
}

// TestHarnessCatchesNoFaults: a run whose faults did not happen proves
// nothing, and the verdict says so.
func TestHarnessCatchesNoFaults(t *testing.T) {
	r := keyedtest.Result{Payments: 1, Applied: 1, ResetRate: 0.1, CutRate: 0.1}
	if err := r.Err(); err == nil || !strings.Contains(err.Error(), "proves nothing") {
		t.Fatalf("no resets, cuts or replays at positive rates: verdict %v, want one saying the run proves nothing", err)
	}
	r = keyedtest.Result{Payments: 1, Applied: 1, RunsByServer: map[string]int{"server-0": 1, "server-1": 0}}
	if err := r.Err(); err == nil || !strings.Contains(err.Error(), "server-1") {
		t.Fatalf("a server without runs: verdict %v, want one naming it", err)
	}
}

func TestRunErrors(t *testing.T) {
	if _, err := keyedtest.Run(t.Context(), keyedtest.Config{}); err == nil {
		t.Error("Run without a store: nil error")
	}
	if _, err := keyedtest.Run(t.Context(), keyedtest.Config{Stores: memoryStores(t), Payments: -1}); err == nil {
		t.Error("Run with -1 payments: nil error")
	}
	if _, err := keyedtest.Run(t.Context(), keyedtest.Config{Stores: memoryStores(t), Interceptor: []grpcretry.IdempotencyOption{grpcretry.WithKeyPushback(0)}}); err == nil {
		t.Error("Run with a bad interceptor option: nil error")
	}
}
