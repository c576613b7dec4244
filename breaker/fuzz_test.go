package breaker_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stormguard/stormguard/breaker"
)

// FuzzBreaker builds a breaker from arbitrary settings (New must either
// reject them with an invalid-config error or build a breaker that never panics)
// and drives it with an arbitrary sequence of calls, outcomes, cancels and
// clock moves, checking that the state changes form a valid path, one
// generation each, and that no half-open generation admits more than
// Probes probes.
func FuzzBreaker(f *testing.F) {
	f.Add(0.5, uint32(10000), uint16(10), int32(20), uint32(30000), uint32(0), int32(5), []byte{0, 1, 2, 3, 4, 5})
	f.Add(0.2, uint32(100), uint16(1), int32(1), uint32(5), uint32(40), int32(2), []byte{1, 1, 0x23, 0, 2, 0x44, 6, 7})
	f.Fuzz(func(t *testing.T, ratio float64, windowMs uint32, buckets uint16, minCalls int32, openMs, maxOpenMs uint32, probes int32, ops []byte) {
		clk := newClock()
		rec := &recorder{}
		b, err := breaker.New(breaker.Config{
			FailureRatio:  ratio,
			Window:        time.Duration(windowMs) * time.Millisecond,
			Buckets:       int(buckets),
			MinCalls:      int(minCalls),
			OpenFor:       time.Duration(openMs) * time.Millisecond,
			MaxOpenFor:    time.Duration(maxOpenMs) * time.Millisecond,
			Probes:        int(probes),
			OnStateChange: rec.add,
			Now:           clk.Now,
		})
		if err != nil {
			if !strings.HasPrefix(err.Error(), "breaker: invalid config: ") {
				t.Fatalf("New error %v is not an invalid-config error", err)
			}
			return
		}
		type heldPermit struct {
			p   breaker.Permit
			gen uint64
		}
		var held []heldPermit
		probesIn := map[uint64]int{} // probes admitted and not cancelled, per generation
		for i, op := range ops {
			if i >= 2000 {
				break
			}
			switch op & 7 {
			case 0, 1: // a call that is held open
				b.State() // half-opens first if due, like Allow
				gen := uint64(len(rec.get())) + 1
				p, err := b.Allow()
				if err == nil {
					held = append(held, heldPermit{p, gen})
					if p.Probe() {
						probesIn[gen]++
						if probesIn[gen] > b.Config().Probes {
							t.Fatalf("op %d: probe %d admitted in generation %d, Probes is %d", i, probesIn[gen], gen, b.Config().Probes)
						}
					}
				} else if !errors.Is(err, breaker.ErrOpen) {
					t.Fatalf("op %d: Allow() = %v, want nil or ErrOpen", i, err)
				}
			case 2, 3: // finish the oldest held call
				if len(held) > 0 {
					b.Done(held[0].p, op&8 == 0)
					held = held[1:]
				}
			case 4: // cancel the newest
				if len(held) > 0 {
					h := held[len(held)-1]
					if h.p.Probe() && uint64(len(rec.get()))+1 == h.gen {
						probesIn[h.gen]-- // its slot is free again
					}
					b.Cancel(h.p)
					held = held[:len(held)-1]
				}
			case 5:
				_ = b.Execute(func() error {
					if op&8 != 0 {
						return errors.New("x")
					}
					return nil
				})
			case 6:
				clk.Advance(time.Duration(op>>3) * time.Millisecond * time.Duration(1+windowMs/16))
			case 7:
				_ = b.State()
			}
		}
		snap := b.Snapshot() // may half-open: read the changes after it
		events := rec.get()
		prev := "closed"
		for i, e := range events {
			from, to, _ := cut(e)
			if from != prev || from == to {
				t.Fatalf("state change %d is %q after %q (%q)", i, e, prev, events)
			}
			prev = to
		}
		if snap.State.String() != prev {
			t.Fatalf("Snapshot = %+v after changes %q", snap, events)
		}
	})
}
