package budget_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stormguard/stormguard/budget"
)

// FuzzBudget builds a budget from arbitrary settings (New must either
// reject them with an invalid-config error or build a budget that never panics)
// and replays an arbitrary sequence of deposits and withdrawals, with time
// moving forwards and backwards, against the reference model.
func FuzzBudget(f *testing.F) {
	f.Add(0.1, 1.0, uint16(10), uint32(1000), []byte{0, 1, 2, 3, 0x11, 0x20, 0x31})
	f.Add(1.0, 0.0, uint16(1), uint32(1), []byte{0x0e, 0xff, 0x01, 0x00, 0x09, 0x80})
	f.Add(0.5, 0.3, uint16(7), uint32(3), []byte{0x06, 0x10, 0x07, 0x10, 0x0f, 0x40, 0x01, 0x01})
	f.Fuzz(func(t *testing.T, ratio, perSec float64, slices uint16, sliceMs uint32, ops []byte) {
		window := time.Duration(sliceMs) * time.Millisecond * time.Duration(slices)
		clk := newClock()
		bb, err := budget.New(budget.Config{
			Ratio: ratio, MinPerSecond: perSec, Window: window, Slices: int(slices),
			Now: clk.Now,
		})
		if err != nil {
			if !strings.HasPrefix(err.Error(), "budget: invalid config: ") {
				t.Fatalf("New error %v is not an invalid-config error", err)
			}
			return
		}
		b := clocked{bb, clk}
		// The model takes the effective settings: zero fields are the
		// defaults, negative ratio and floor are none.
		c := b.Config()
		ratio, perSec, window, slices = max(c.Ratio, 0), max(c.MinPerSecond, 0), c.Window, uint16(c.Slices)
		if slices > 64 {
			return // the model scans every slice per operation: keep executions fast
		}
		m := newModel(ratio, perSec, window, int(slices))
		slice := window / time.Duration(slices)
		units := [4]time.Duration{0, time.Microsecond, slice / 16, window / 2}
		now := t0
		for i := 0; i+1 < len(ops) && i < 2000; i += 2 {
			// ops[i]: bit 0 deposit/withdraw, bits 1-2 time unit, bit 3
			// backwards; ops[i+1]: how many units.
			step := units[ops[i]>>1&3] * time.Duration(ops[i+1])
			if ops[i]&8 != 0 {
				step = -step
			}
			now = now.Add(step)
			if ops[i]&1 == 0 {
				b.depositAt(now)
				m.deposit(now)
				continue
			}
			got := b.withdrawAt(now)
			want, cur := m.withdraw(now)
			if got != want {
				t.Fatalf("op %d: Withdraw at +%v = %v, model says %v", i/2, now.Sub(t0), got, want)
			}
			st := b.statsAt(now)
			if st.Retries != m.sum(m.retries, cur) || st.Requests != m.live(cur) {
				t.Fatalf("op %d: Stats at +%v = %+v, model has %d requests %d retries",
					i/2, now.Sub(t0), st, m.live(cur), m.sum(m.retries, cur))
			}
			if got && float64(st.Retries) > st.Limit {
				t.Fatalf("op %d: %d retries admitted, limit %v", i/2, st.Retries, st.Limit)
			}
		}
	})
}
