package guards_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/internal/guards"
	"github.com/stormguard/stormguard/observe"
	"github.com/stormguard/stormguard/retry"
)

func TestTableBoundedFIFO(t *testing.T) {
	made := 0
	tb := guards.NewTable(2, func(name string) (*int, error) { made++; v := made; return &v, nil })
	a1, _ := tb.Get("a")
	if a2, _ := tb.Get("a"); a2 != a1 {
		t.Errorf("second Get(a) built a new state")
	}
	tb.Get("b")
	tb.Get("c") // evicts a, the oldest
	if n := tb.Len(); n != 2 {
		t.Errorf("Len = %d after 3 names in a table of 2, want 2", n)
	}
	if a3, _ := tb.Get("a"); a3 == a1 {
		t.Errorf("Get(a) after its eviction returned the old state")
	}
	if made != 4 {
		t.Errorf("built %d states, want 4 (a, b, c, a again)", made)
	}
	if all := tb.All(); len(all) != 2 || all["a"] == nil || all["c"] == nil {
		t.Errorf("All() = %v, want a and c", all)
	}
}

func TestTableConcurrent(t *testing.T) {
	tb := guards.NewTable(8, func(name string) (string, error) { return name, nil })
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 500 {
				name := fmt.Sprintf("h%d", (g*7+i)%20)
				if v, err := tb.Get(name); err != nil || v != name {
					t.Errorf("Get(%s) = %q, %v", name, v, err)
				}
			}
		})
	}
	wg.Wait()
	if n := tb.Len(); n > 8 {
		t.Errorf("Len = %d, above the bound 8", n)
	}
}

func TestTableMakeError(t *testing.T) {
	boom := errors.New("boom")
	tb := guards.NewTable(2, func(name string) (int, error) { return 0, boom })
	if _, err := tb.Get("x"); err != boom {
		t.Errorf("Get = %v, want the builder's error", err)
	}
	if tb.Len() != 0 {
		t.Errorf("a failed build was kept")
	}
}

func TestTableGetAllocatesNothing(t *testing.T) {
	tb := guards.NewTable(4, func(name string) (int, error) { return len(name), nil })
	tb.Get("a")
	tb.Get("bb")
	if n := testing.AllocsPerRun(100, func() { tb.Get("a") }); n != 0 {
		t.Errorf("Get of a held name allocates %v times", n)
	}
}

func TestBuild(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var logs bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, nil)).With("host", "h.example")
	var events []observe.Event
	var user []string
	g, err := guards.Build(guards.Spec{
		Name: "h.example", Component: "httpretry",
		Budget:  &budget.Config{},
		Breaker: &breaker.Config{MinCalls: 1, OnStateChange: func(from, to breaker.State) { user = append(user, to.String()) }},
		Clock:   fixedClock{now},
		Logger:  logger,
		Observer: observe.Func(func(ctx context.Context, e observe.Event) {
			events = append(events, e)
		}),
	})
	bud, brk := g.Budget, g.Breaker
	if err != nil || bud == nil || brk == nil {
		t.Fatalf("Build = %+v, %v", g, err)
	}
	p, _ := brk.Allow()
	brk.Done(p, false) // trips
	if len(user) != 1 || len(events) != 1 || events[0].Name != "h.example" || events[0].To != "open" {
		t.Errorf("state change reached user %v, observer %+v; want one each, named", user, events)
	}
	if !strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), "host=h.example") || !strings.Contains(logs.String(), "httpretry: circuit breaker state change") {
		t.Errorf("log = %q, want one Warn with the host", logs.String())
	}
	if _, err := guards.Build(guards.Spec{Breaker: &breaker.Config{FailureRatio: 2}}); !errors.Is(err, breaker.ErrInvalidConfig) {
		t.Errorf("Build(bad breaker) = %v", err)
	}
	if g, err := guards.Build(guards.Spec{}); g != (retry.Guards{}) || err != nil {
		t.Errorf("Build(nothing) = %+v, %v; want no guards", g, err)
	}
}

type fixedClock struct{ t time.Time }

func (c fixedClock) Now() time.Time                                   { return c.t }
func (c fixedClock) Sleep(ctx context.Context, d time.Duration) error { return ctx.Err() }
