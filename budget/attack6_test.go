package budget_test

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stormguard/stormguard/budget"
)

// The package's admission rule, exactly, as a model: with a clock that only
// goes forward, every Withdraw must be admitted iff the rule says so, and
// Stats must report the window's counts.
func TestAttack6ModelForwardClock(t *testing.T) {
	r := rand.New(rand.NewPCG(6, 6))
	for trial := 0; trial < 300; trial++ {
		slices := 1 + r.IntN(7)
		slice := time.Duration(1+r.IntN(5)) * time.Millisecond
		window := slice * time.Duration(slices)
		ratio := []float64{-1, 0.1, 0.5, 1, 0.3333}[r.IntN(5)]
		floor := []float64{-1, 1, 0.5, 1000, 0.001}[r.IntN(5)]
		t0 := time.Unix(1_000_000, 0)
		now := t0
		b, err := budget.New(budget.Config{Ratio: ratio, MinPerSecond: floor, Window: window, Slices: slices, Now: func() time.Time { return now }})
		if err != nil {
			t.Fatal(err)
		}
		effR, effF := max(ratio, 0), max(floor, 0)
		reserve := effF * window.Seconds()
		type ev struct {
			s   int64
			dep bool
		}
		var evs []ev
		for step := 0; step < 400; step++ {
			switch r.IntN(4) {
			case 0:
				now = now.Add(time.Duration(r.IntN(int(slice) * 2)))
			case 1:
				b.Deposit()
				evs = append(evs, ev{int64(now.Sub(t0) / slice), true})
			default:
				s := int64(now.Sub(t0) / slice)
				var req, ret uint64
				for _, e := range evs {
					if e.s > s-int64(slices) && e.s <= s {
						if e.dep {
							req++
						} else {
							ret++
						}
					}
				}
				st := b.Stats()
				if st.Requests != int(req) || st.Retries != int(ret) {
					t.Fatalf("trial %d step %d: Stats = %+v, model req=%d ret=%d", trial, step, st, req, ret)
				}
				want := float64(ret+1) <= (effR*float64(req)+reserve)*(1+1e-12) // the rounding allowed for, as documented
				got := b.Withdraw()
				if got != want {
					t.Fatalf("trial %d step %d (slices %d slice %v ratio %v floor %v): Withdraw = %v, model %v (req %d ret %d)",
						trial, step, slices, slice, ratio, floor, got, want, req, ret)
				}
				if got {
					evs = append(evs, ev{s, false})
				}
			}
		}
	}
}
