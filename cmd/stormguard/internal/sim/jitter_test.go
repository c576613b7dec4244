package sim_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/stormguard/stormguard/backoff"
	"github.com/stormguard/stormguard/cmd/stormguard/internal/sim"
)

// seedTable is the reference table in docs/backoff.md, byte for byte.
const seedTable = `clients=1000 all fail at t=0, base=100ms cap=10000ms, window=50ms, seed=42

none
  retry 1: occupied windows=1, peak retries in one window=1000
  retry 2: occupied windows=1, peak retries in one window=1000
  retry 3: occupied windows=1, peak retries in one window=1000
  retry 4: occupied windows=1, peak retries in one window=1000

full
  retry 1: occupied windows=4, peak retries in one window=277
  retry 2: occupied windows=12, peak retries in one window=147
  retry 3: occupied windows=26, peak retries in one window=72
  retry 4: occupied windows=52, peak retries in one window=48

equal
  retry 1: occupied windows=2, peak retries in one window=520
  retry 2: occupied windows=6, peak retries in one window=265
  retry 3: occupied windows=14, peak retries in one window=126
  retry 4: occupied windows=26, peak retries in one window=79

decorrelated
  retry 1: occupied windows=4, peak retries in one window=277
  retry 2: occupied windows=20, peak retries in one window=124
  retry 3: occupied windows=57, peak retries in one window=52
  retry 4: occupied windows=116, peak retries in one window=33
`

func TestJitterReproducesReferenceTable(t *testing.T) {
	r, err := sim.Jitter(sim.DefaultJitterConfig())
	if err != nil {
		t.Fatalf("Jitter(default) = %v", err)
	}
	var buf bytes.Buffer
	if err := r.WriteText(&buf); err != nil {
		t.Fatalf("WriteText = %v", err)
	}
	if got := buf.String(); got != seedTable {
		t.Errorf("Jitter(default) table differs from the reference table:\n got:\n%s\nwant:\n%s", got, seedTable)
	}
}

func TestJitterHistograms(t *testing.T) {
	c := sim.DefaultJitterConfig()
	r, err := sim.Jitter(c)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range r.Strategies {
		for _, rr := range s.Rounds {
			sum, peak := 0, 0
			var last time.Duration = -1
			for _, b := range rr.Histogram {
				if b.Count <= 0 || b.Start <= last || b.Start%c.Window != 0 {
					t.Fatalf("%v round %d: bad bin %+v after %v", s.Strategy, rr.Round, b, last)
				}
				last = b.Start
				sum += b.Count
				peak = max(peak, b.Count)
			}
			if sum != c.Clients || peak != rr.Peak || len(rr.Histogram) != rr.Occupied {
				t.Errorf("%v round %d: histogram sum=%d peak=%d bins=%d, want %d, %d, %d",
					s.Strategy, rr.Round, sum, peak, len(rr.Histogram), c.Clients, rr.Peak, rr.Occupied)
			}
		}
	}
	// No jitter: every client retries at exactly 200, 600, 1400, 3000 ms.
	none := r.Strategies[0]
	for i, want := range []time.Duration{200, 600, 1400, 3000} {
		if got := none.Rounds[i].Histogram[0].Start; got != want*time.Millisecond {
			t.Errorf("none round %d lands at %v, want %v", i+1, got, want*time.Millisecond)
		}
	}
}

func TestJitterDeterministicAndSparse(t *testing.T) {
	// A tiny window makes the sparse counting path run; results must agree
	// with themselves across runs and keep every client.
	c := sim.JitterConfig{Clients: 500, Rounds: 3, Window: time.Microsecond, Base: 100 * time.Millisecond, Cap: 10 * time.Second, Seed: 7,
		Strategies: []backoff.Strategy{backoff.FullJitter, backoff.Decorrelated}}
	a, err := sim.Jitter(c)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := sim.Jitter(c)
	if !reflect.DeepEqual(a, b) {
		t.Fatal("Jitter is not deterministic for a fixed seed")
	}
	for _, s := range a.Strategies {
		for _, rr := range s.Rounds {
			sum := 0
			for _, bin := range rr.Histogram {
				sum += bin.Count
			}
			if sum != c.Clients {
				t.Errorf("%v round %d: %d retries counted, want %d", s.Strategy, rr.Round, sum, c.Clients)
			}
		}
	}
	c.Seed = 8
	d, _ := sim.Jitter(c)
	if reflect.DeepEqual(a.Strategies, d.Strategies) {
		t.Error("seeds 7 and 8 gave identical results")
	}
}

func TestJitterRejectsBadConfig(t *testing.T) {
	base := sim.DefaultJitterConfig()
	tests := []struct {
		name string
		mod  func(*sim.JitterConfig)
	}{
		{"no clients", func(c *sim.JitterConfig) { c.Clients = 0 }},
		{"negative rounds", func(c *sim.JitterConfig) { c.Rounds = -1 }},
		{"zero window", func(c *sim.JitterConfig) { c.Window = 0 }},
		{"negative base", func(c *sim.JitterConfig) { c.Base = -time.Millisecond }},
		{"cap below base", func(c *sim.JitterConfig) { c.Cap = time.Millisecond }},
		{"too many rounds", func(c *sim.JitterConfig) { c.Rounds = sim.MaxJitterRounds + 1 }},
		{"too many retries", func(c *sim.JitterConfig) { c.Clients = sim.MaxJitterRetries/(4*4) + 1 }},
		{"too many clients for one round", func(c *sim.JitterConfig) {
			c.Clients, c.Rounds, c.Strategies = sim.MaxJitterRetries+1, 1, []backoff.Strategy{backoff.NoJitter}
		}},
		{"strategy listed many times", func(c *sim.JitterConfig) {
			c.Clients, c.Rounds = 1_000_000, 1
			c.Strategies = make([]backoff.Strategy, 17)
		}},
		{"cap too long", func(c *sim.JitterConfig) { c.Cap = sim.MaxJitterCap + 1 }},
		{"base too long", func(c *sim.JitterConfig) { c.Base, c.Cap = sim.MaxJitterCap+1, 0 }},
		{"huge cap", func(c *sim.JitterConfig) { c.Base, c.Cap = 1<<62, 1<<63-1 }},
	}
	for _, tt := range tests {
		c := base
		tt.mod(&c)
		if _, err := sim.Jitter(c); !errors.Is(err, sim.ErrInvalidConfig) {
			t.Errorf("%s: Jitter error = %v, want ErrInvalidConfig", tt.name, err)
		}
	}
}

// At the limits, a client's time is far from overflowing: every window
// starts at or after t=0 and the counts add up.
func TestJitterAtLimits(t *testing.T) {
	c := sim.JitterConfig{Clients: 10, Rounds: sim.MaxJitterRounds, Window: time.Nanosecond,
		Base: sim.MaxJitterCap, Cap: sim.MaxJitterCap, Seed: 1}
	r, err := sim.Jitter(c)
	if err != nil {
		t.Fatalf("Jitter(%+v) = %v", c, err)
	}
	for _, s := range r.Strategies {
		for _, rr := range s.Rounds {
			n := 0
			for _, b := range rr.Histogram {
				if b.Start < 0 {
					t.Fatalf("%v round %d: window at %v, want none before t=0", s.Strategy, rr.Round, b.Start)
				}
				n += b.Count
			}
			if n != c.Clients {
				t.Fatalf("%v round %d: %d retries counted, want %d", s.Strategy, rr.Round, n, c.Clients)
			}
		}
	}
}

func TestJitterJSON(t *testing.T) {
	r, err := sim.Jitter(sim.DefaultJitterConfig())
	if err != nil {
		t.Fatal(err)
	}
	data, err := json.Marshal(r)
	if err != nil {
		t.Fatalf("json.Marshal = %v", err)
	}
	if !strings.Contains(string(data), `"strategy":"decorrelated"`) {
		t.Errorf("JSON lacks strategy names: %.200s", data)
	}
	var back sim.JitterResult
	if err := json.Unmarshal(data, &back); err != nil {
		t.Fatalf("json.Unmarshal = %v", err)
	}
	if !reflect.DeepEqual(&back, r) {
		t.Error("JSON round trip changed the result")
	}
}

func BenchmarkJitterMillionClients(b *testing.B) {
	c := sim.DefaultJitterConfig()
	c.Clients = 1_000_000
	b.ReportAllocs()
	for b.Loop() {
		if _, err := sim.Jitter(c); err != nil {
			b.Fatal(err)
		}
	}
}

// FuzzJitterConfig feeds arbitrary settings to Jitter: it returns a result
// or an error wrapping ErrInvalidConfig, never panics, and every retry
// lands in a window at or after t=0. Settings that would merely run long
// are skipped.
func FuzzJitterConfig(f *testing.F) {
	f.Add(1000, 4, int64(50e6), int64(100e6), int64(10e9), uint32(42), uint8(1), uint8(4))
	f.Add(3, 1000, int64(1), int64(1<<62), int64(1<<63-1), uint32(0), uint8(0), uint8(1))
	f.Add(7, 900, int64(1), int64(24*3600e9), int64(24*3600e9), uint32(1), uint8(3), uint8(2))
	f.Fuzz(func(t *testing.T, clients, rounds int, window, base, capNs int64, seed uint32, first, n uint8) {
		if clients > 1000 && rounds > 0 && clients*rounds > 20_000 {
			t.Skip("would run long")
		}
		c := sim.JitterConfig{Clients: clients, Rounds: rounds, Window: time.Duration(window),
			Base: time.Duration(base), Cap: time.Duration(capNs), Seed: seed}
		for i := range int(n % 6) {
			c.Strategies = append(c.Strategies, backoff.Strategy((int(first)+i)%5))
		}
		r, err := sim.Jitter(c)
		if err != nil {
			if !errors.Is(err, sim.ErrInvalidConfig) || r != nil {
				t.Fatalf("Jitter(%+v) = %v, %v; want nil and ErrInvalidConfig", c, r, err)
			}
			return
		}
		for _, s := range r.Strategies {
			for _, rr := range s.Rounds {
				total := 0
				for _, b := range rr.Histogram {
					if b.Start < 0 || b.Count < 1 {
						t.Fatalf("Jitter(%+v): %v round %d has bin %+v", c, s.Strategy, rr.Round, b)
					}
					total += b.Count
				}
				if total != clients {
					t.Fatalf("Jitter(%+v): %v round %d counts %d retries, want %d", c, s.Strategy, rr.Round, total, clients)
				}
			}
		}
	})
}
