package sim_test

import (
	"testing"
	"time"

	"github.com/stormguard/stormguard/cmd/stormguard/internal/sim"
)

func TestProgressCallbacks(t *testing.T) {
	cc := sim.DefaultContentionConfig()
	cc.Clients, cc.Runs = []int{5, 10, 20}, 2
	var calls, last, total int
	cc.Progress = func(done, n int) { calls++; last, total = done, n }
	if _, err := sim.Contention(cc); err != nil {
		t.Fatal(err)
	}
	if want := 3 * len(cc.Strategies); calls != want || last != want || total != want {
		t.Errorf("contention Progress: %d calls, last (%d, %d); want %d calls ending (%d, %d)", calls, last, total, want, want, want)
	}
	oc := sim.DefaultOutageConfig()
	oc.Horizon = 20 * time.Second
	oc.Policies = sim.DefaultOutagePolicies()[:2]
	calls = 0
	oc.Progress = func(done, n int) { calls++; last, total = done, n }
	r, err := sim.Outage(oc)
	if err != nil {
		t.Fatal(err)
	}
	if calls != 2 || last != 2 || total != 2 {
		t.Errorf("outage Progress: %d calls, last (%d, %d); want 2 ending (2, 2)", calls, last, total)
	}
	if r.Config.Progress != nil {
		t.Error("OutageResult.Config keeps the Progress func; the result should be plain data")
	}
}
