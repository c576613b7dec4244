package sim_test

import (
	"bytes"
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/stormguard/stormguard/cmd/stormguard/internal/sim"
)

// layers runs c and fails the test on error.
func layers(t *testing.T, c sim.LayersConfig) *sim.LayersResult {
	t.Helper()
	r, err := sim.Layers(c)
	if err != nil {
		t.Fatalf("Layers(%+v) = %v", c, err)
	}
	return r
}

func TestLayersExact(t *testing.T) {
	t.Parallel()
	tests := []struct {
		layers, attempts int
		naive            []int64
	}{
		{4, 3, []int64{3, 9, 27, 81}}, // the story's figures
		{3, 2, []int64{2, 4, 8}},
		{3, 1, []int64{1, 1, 1}},
		{2, 5, []int64{5, 25}},
	}
	for _, tt := range tests {
		c := sim.DefaultLayersConfig()
		c.Layers, c.Attempts = tt.layers, tt.attempts
		c.Rate = 10 // the budget columns are not checked here
		r := layers(t, c)
		if len(r.Rows) != tt.layers {
			t.Fatalf("Layers(L=%d, A=%d) has %d rows, want %d", tt.layers, tt.attempts, len(r.Rows), tt.layers)
		}
		for i, row := range r.Rows {
			if row.Layers != i+1 || row.Naive != tt.naive[i] || row.Signal != int64(tt.attempts) {
				t.Errorf("Layers(A=%d) row %d = {layers %d, naive %d, signal %d}, want {layers %d, naive %d, signal %d}",
					tt.attempts, i, row.Layers, row.Naive, row.Signal, i+1, tt.naive[i], tt.attempts)
			}
		}
	}
}

// A high-volume client with a 10% budget costs about 1.1x its load at a
// failing bottom; budgets at every layer still compound, (1.1)^L; the
// don't-retry signal plus a budget holds any depth at about 1.1x.
func TestLayersBudget(t *testing.T) {
	t.Parallel()
	r := layers(t, sim.DefaultLayersConfig())
	if got := r.Rows[0].Budget; got < 1.05 || got > 1.15 {
		t.Errorf("Layers(default) budget at L=1 = %.3fx, want about 1.1x (in [1.05, 1.15])", got)
	}
	for _, row := range r.Rows {
		if row.SignalBudget < 1.05 || row.SignalBudget > 1.15 {
			t.Errorf("Layers(default) signal+budget at L=%d = %.3fx, want about 1.1x (in [1.05, 1.15])", row.Layers, row.SignalBudget)
		}
		if want := math.Pow(1.1, float64(row.Layers)); math.Abs(row.Budget-want) > 0.05*want {
			t.Errorf("Layers(default) budget at L=%d = %.3fx, want about 1.1^L = %.3fx", row.Layers, row.Budget, want)
		}
	}
}

// A low-volume client lives on the budget's floor: at one request every
// five seconds, the floor of 10 retries per window admits nearly every
// retry, so the budget buys little and the bottom sees close to 3x. Without
// the floor the same client could not retry at all.
func TestLayersBudgetFloorForLowVolume(t *testing.T) {
	t.Parallel()
	c := sim.DefaultLayersConfig()
	c.Layers, c.Rate, c.Duration = 1, 0.2, time.Hour
	r := layers(t, c)
	if got := r.Rows[0].Budget; got < 2.5 {
		t.Errorf("Layers(rate 0.2/s) budget at L=1 = %.3fx, want near 3x (>= 2.5): the floor admits most retries", got)
	}
	c.Budget.MinPerSecond = 0
	r = layers(t, c)
	if got := r.Rows[0].Budget; got != 1 {
		t.Errorf("Layers(rate 0.2/s, no floor) budget at L=1 = %.3fx, want 1x: 10%% of 2 requests admits no retry", got)
	}
}

func TestLayersDeterministic(t *testing.T) {
	t.Parallel()
	c := sim.DefaultLayersConfig()
	c.Layers, c.Duration = 2, 15*time.Second
	a, b := layers(t, c), layers(t, c)
	if !reflect.DeepEqual(a, b) {
		t.Errorf("Layers(seed %d) differs between two runs:\n%+v\n%+v", c.Seed, a, b)
	}
}

func TestLayersInvalidConfig(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		modify func(*sim.LayersConfig)
	}{
		{"zero layers", func(c *sim.LayersConfig) { c.Layers = 0 }},
		{"too many layers", func(c *sim.LayersConfig) { c.Layers = sim.MaxLayers + 1 }},
		{"zero attempts", func(c *sim.LayersConfig) { c.Attempts = 0 }},
		{"too many calls", func(c *sim.LayersConfig) { c.Layers, c.Attempts = 7, 10 }},
		{"zero rate", func(c *sim.LayersConfig) { c.Rate = 0 }},
		{"NaN rate", func(c *sim.LayersConfig) { c.Rate = math.NaN() }},
		{"infinite rate", func(c *sim.LayersConfig) { c.Rate = math.Inf(1) }},
		{"too many requests", func(c *sim.LayersConfig) { c.Rate = 1e9 }},
		{"negative warmup", func(c *sim.LayersConfig) { c.Warmup = -time.Second }},
		{"duration within warmup", func(c *sim.LayersConfig) { c.Duration = c.Warmup }},
		{"budget ratio above 1", func(c *sim.LayersConfig) { c.Budget.Ratio = 2 }},
		{"budget without slices", func(c *sim.LayersConfig) { c.Budget.Slices = 0 }},
	}
	for _, tt := range tests {
		c := sim.DefaultLayersConfig()
		tt.modify(&c)
		r, err := sim.Layers(c)
		if !errors.Is(err, sim.ErrInvalidConfig) || r != nil {
			t.Errorf("Layers(%s) = %v, %v; want nil, error wrapping ErrInvalidConfig", tt.name, r, err)
		}
	}
}

func TestLayersWriteText(t *testing.T) {
	t.Parallel()
	c := sim.DefaultLayersConfig()
	c.Rate = 10
	var buf bytes.Buffer
	if err := layers(t, c).WriteText(&buf); err != nil {
		t.Fatalf("WriteText = %v", err)
	}
	out := buf.String()
	for _, want := range []string{"signal+budget", "\n     4         81          3 "} {
		if !strings.Contains(out, want) {
			t.Errorf("WriteText output lacks %q:\n%s", want, out)
		}
	}
}

func BenchmarkLayers(b *testing.B) {
	c := sim.DefaultLayersConfig()
	for b.Loop() {
		if _, err := sim.Layers(c); err != nil {
			b.Fatal(err)
		}
	}
}
