package sim_test

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/stormguard/stormguard/cmd/stormguard/internal/sim"
)

// Every result survives a JSON round trip, with the documented field names.
func TestStormResultsJSON(t *testing.T) {
	t.Parallel()
	cc := sim.DefaultContentionConfig()
	cc.Clients, cc.Runs = []int{10}, 2
	lc := sim.DefaultLayersConfig()
	lc.Rate = 10
	oc := sim.DefaultOutageConfig()
	oc.Horizon = 16 * time.Second
	oc.Policies = oc.Policies[1:]

	cr, err := sim.Contention(cc)
	if err != nil {
		t.Fatalf("Contention = %v", err)
	}
	lr, err := sim.Layers(lc)
	if err != nil {
		t.Fatalf("Layers = %v", err)
	}
	or, err := sim.Outage(oc)
	if err != nil {
		t.Fatalf("Outage = %v", err)
	}
	tests := []struct {
		name   string
		v      any
		fresh  func() any
		fields []string
	}{
		{"ContentionResult", cr, func() any { return new(sim.ContentionResult) },
			[]string{`"strategy":"decorrelated"`, `"calls":`, `"completion_ns":`, `"delay_mean_ns":`}},
		{"LayersResult", lr, func() any { return new(sim.LayersResult) },
			[]string{`"naive":81`, `"signal":3`, `"signal_budget":`, `"min_per_second":`}},
		{"OutageResult", or, func() any { return new(sim.OutageResult) },
			[]string{`"backoff":"full"`, `"outage_amplification":`, `"load":[`, `"recover_after_ns":`, `"open_for_ns":`,
				`"wait":true`, `"fleet":true`, `"outage_goodput":`, `"sync_every_ns":`, `"p99_ns":`}},
	}
	for _, tt := range tests {
		b, err := json.Marshal(tt.v)
		if err != nil {
			t.Fatalf("json.Marshal(%s) = %v", tt.name, err)
		}
		for _, f := range tt.fields {
			if !strings.Contains(string(b), f) {
				t.Errorf("json.Marshal(%s) lacks %s", tt.name, f)
			}
		}
		got := tt.fresh()
		if err := json.Unmarshal(b, got); err != nil {
			t.Fatalf("json.Unmarshal(%s) = %v", tt.name, err)
		}
		if !reflect.DeepEqual(got, tt.v) {
			t.Errorf("json round trip of %s changed it:\n got %+v\nwant %+v", tt.name, got, tt.v)
		}
	}
}

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
