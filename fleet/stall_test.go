package fleet

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stormguard/stormguard/limit"
	"github.com/stormguard/stormguard/retry"
)

// stallBaseline gives the host of s a baseline of 20 ms and a rate served
// of 100 per second: four clean windows of process "a" (100 successes of
// 20 ms each), the last closed by a report at the start of the fifth. It
// returns the time of that report.
func stallBaseline(s *limitScript) int64 {
	s.t.Helper()
	var now int64
	for w := range int64(5) {
		now = t0 + w*1_000_000 + 1
		s.report(now, "a", 0, 100, 0, 100*20_000, 100)
	}
	return now
}

// TestScriptStallRule: the stall rule on a real Redis (see stalled in
// script.lua). Without a baseline there is no threshold, and reports are
// ignored. With the 20 ms baseline the threshold is 80 ms (4x, at least
// 50 ms): a shorter stall is ignored; the first at or above it begins a
// suspicion, published as "s <time> <key>" and shown in replies. A
// success reported for an older suspicion counts for nothing; one for
// this one starts the count of reports again. The breaker opens at a
// report 150 ms (8 / the 100 per second served, at least 150 ms) after
// both the suspicion's start and the last success, 75 ms after the first
// report since that success, and with two reports before it (each
// condition missed alone keeps it closed); the opening is published as
// any other, and an open breaker takes no stall report.
func TestScriptStallRule(t *testing.T) {
	s := newLimitScript(t, 1000)
	ctx := context.Background()
	ps := s.rc.Subscribe(ctx, s.key[:strings.Index(s.key, "}")+1]+"/open")
	defer ps.Close()
	if _, err := ps.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	ch := ps.Channel()
	next := func(want string) {
		t.Helper()
		select {
		case m := <-ch:
			if m.Payload != want {
				t.Fatalf("published %q, want %q", m.Payload, want)
			}
		case <-time.After(2 * time.Second):
			t.Fatalf("no message, want %q", want)
		}
	}
	none := func() {
		t.Helper()
		select {
		case m := <-ch:
			t.Fatalf("published %q, want nothing", m.Payload)
		case <-time.After(100 * time.Millisecond):
		}
	}
	us := func(v int64) string { return strconv.FormatInt(v, 10) }
	closed := func(now int64, h syncHost, why string) {
		t.Helper()
		if w := s.sync(now, h); w.state != fleetClosed {
			t.Fatalf("opened: %s", why)
		}
	}

	if w := s.sync(t0-1_000_000, syncHost{stallUS: 10_000_000}); w.stallUS != 0 || w.suspect != 0 {
		t.Fatalf("no baseline: threshold %d µs, suspicion %d, want none", w.stallUS, w.suspect)
	}
	none()
	now := stallBaseline(s)
	if w := s.sync(now+1, syncHost{}); w.stallUS != 80_000 {
		t.Fatalf("threshold %d µs, want 80000 (4x the 20 ms baseline)", w.stallUS)
	}
	if w := s.sync(now+2, syncHost{stallUS: 79_999}); w.suspect != 0 {
		t.Fatalf("a stall under the threshold began a suspicion at %d", w.suspect)
	}
	za := now + 3
	if w := s.sync(za, syncHost{stallUS: 80_000}); w.suspect != za {
		t.Fatalf("suspicion %d, want %d", w.suspect, za)
	}
	next("s " + us(za) + " " + s.key)
	closed(za+10_000, syncHost{stallUS: 80_000}, "three reports 10 ms into the suspicion")
	closed(za+100_000, syncHost{aliveAt: za - 1}, "on a success")
	closed(za+149_999, syncHost{stallUS: 80_000}, "4 reports, the last 149.999 ms after the suspicion began")
	closed(za+150_000, syncHost{aliveAt: za}, "on a success")
	closed(za+200_000, syncHost{stallUS: 80_000}, "one report since the success")
	closed(za+290_000, syncHost{stallUS: 80_000}, "two reports, 140 ms after the success")
	closed(za+299_999, syncHost{stallUS: 80_000}, "three reports, 149.999 ms after the success")
	if w := s.sync(za+300_000, syncHost{stallUS: 80_000}); w.state != fleetOpen || w.suspect != 0 {
		t.Fatalf("four reports, 150 ms after the success and 100 ms after the first: state %d, suspicion %d; want open, none", w.state, w.suspect)
	}
	next("1 " + us(za+300_000) + " " + s.key)
	if w := s.sync(za+2_000_000, syncHost{stallUS: 10_000_000, seen: 1}); w.suspect != 0 || w.state != fleetOpen {
		t.Fatalf("an open breaker took a stall report: suspicion %d, state %d", w.suspect, w.state)
	}
	none()
}

// TestScriptStallConfirm: each condition of the opening, missed alone,
// keeps the breaker closed, and the report that meets them all opens it.
// The reports come at the times listed (ms) after a success reported for
// the suspicion in force, or after the suspicion began (no success);
// the breaker opens at the last one only.
func TestScriptStallConfirm(t *testing.T) {
	for _, c := range []struct {
		name    string
		success bool
		reports []int64 // ms
	}{
		{"150 ms after the success", true, []int64{50, 100, 149, 150}},
		{"75 ms after the first report since", true, []int64{150, 151, 200, 225}},
		{"two reports before it", true, []int64{100, 200, 200}},
		{"150 ms after the suspicion began", false, []int64{40, 80, 100, 149, 150}},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := newLimitScript(t, 1000)
			za := stallBaseline(s) + 10
			s.sync(za, syncHost{stallUS: 80_000})
			from := za
			if c.success {
				from = za + 1
				s.sync(from, syncHost{aliveAt: za})
			}
			for i, ms := range c.reports {
				w := s.sync(from+ms*1000, syncHost{stallUS: 80_000})
				if last := i == len(c.reports)-1; (w.state == fleetOpen) != last {
					t.Fatalf("report %d at %d ms: state %d, want open at the last only", i, ms, w.state)
				}
			}
		})
	}
}

// TestScriptStallCleared: a suspicion that no report renews for 2 s is
// cleared at the host's next sync ("c <time> <key>" published, replies
// show none), and the next report begins another.
func TestScriptStallCleared(t *testing.T) {
	s := newLimitScript(t, 1000)
	ctx := context.Background()
	ps := s.rc.Subscribe(ctx, s.key[:strings.Index(s.key, "}")+1]+"/open")
	defer ps.Close()
	if _, err := ps.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	ch := ps.Channel()
	za := stallBaseline(s) + 10
	s.sync(za, syncHost{stallUS: 80_000})
	s.sync(za+1_000_000, syncHost{stallUS: 80_000})
	if w := s.sync(za+2_999_999, syncHost{}); w.suspect != za {
		t.Fatalf("suspicion %d 1.999999 s after the last report, want %d", w.suspect, za)
	}
	if w := s.sync(za+3_000_000, syncHost{}); w.suspect != 0 {
		t.Fatalf("suspicion %d 2 s after the last report, want none", w.suspect)
	}
	if w := s.sync(za+3_000_001, syncHost{stallUS: 80_000}); w.suspect != za+3_000_001 {
		t.Fatalf("a report after the clearing: suspicion %d, want a new one", w.suspect)
	}
	for _, want := range []string{"s " + strconv.FormatInt(za, 10), "c " + strconv.FormatInt(za+3_000_000, 10), "s " + strconv.FormatInt(za+3_000_001, 10)} {
		select {
		case m := <-ch:
			if m.Payload != want+" "+s.key {
				t.Fatalf("published %q, want %q", m.Payload, want+" "+s.key)
			}
		case <-time.After(2 * time.Second):
			t.Fatalf("no message, want %q", want)
		}
	}
}

// TestScriptStallProbeRounds: while the stall rule holds the breaker open,
// the fleet grants one probe round per probe interval (each probe joins
// the stalled host's queue); after an opening by failures, ProbeRounds.
func TestScriptStallProbeRounds(t *testing.T) {
	s := newLimitScript(t, 1000)
	s.set.rounds = 3
	probe := func(now int64) bool {
		t.Helper()
		args := append(s.set.args("p", now), "1")
		a := make([]any, len(args))
		for i := range args {
			a[i] = args[i]
		}
		v, err := s.script.Run(context.Background(), s.rc, []string{s.key}, a...).Int64Slice()
		if err != nil {
			t.Fatal(err)
		}
		r, err := decodeProbe(v)
		if err != nil {
			t.Fatal(err)
		}
		return r.granted
	}
	za := stallBaseline(s) + 10
	for _, ms := range []int64{0, 100, 150} {
		s.sync(za+ms*1000, syncHost{stallUS: 80_000})
	}
	base := (za/1_000_000 + 1) * 1_000_000 // the start of a probe interval
	if w := s.sync(base, syncHost{}); w.state != fleetOpen {
		t.Fatal("not opened by the stall rule")
	}
	if got := []bool{probe(base + 1), probe(base + 400_000), probe(base + 800_000), probe(base + 1_000_001)}; !slices.Equal(got, []bool{true, false, false, true}) {
		t.Fatalf("opened by the stall rule: rounds granted %v, want one per interval", got)
	}
	// A close, and an opening by failures: three rounds per interval.
	s.set.minCalls = 1
	s.sync(base+1_100_000, syncHost{close: true, seen: 1})
	if w := s.sync(base+1_200_000, syncHost{failures: 5, seen: 2}); w.state != fleetOpen {
		t.Fatalf("not opened by failures: state %d", w.state)
	}
	b2 := base + 2_000_000
	if got := []bool{probe(b2 + 1), probe(b2 + 400_000), probe(b2 + 800_000)}; !slices.Equal(got, []bool{true, true, true}) {
		t.Fatalf("opened by failures: rounds granted %v, want three per interval", got)
	}
}

// stallBackend is a backend whose syncs succeed with the stall threshold
// and suspicion the test sets, and records the stall reports and the
// alive reports the syncs carry.
type stallBackend struct {
	mu             sync.Mutex
	thresholdUS    int64
	suspect        int64
	stalls, alives []int64
}

func (b *stallBackend) eval(_ context.Context, keys, args []string) ([]int64, error) {
	if args[0] != "s" {
		return nil, errDown
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	// One host without returns: its ARGV from args[13], stall and alive at args[19], args[20].
	if len(keys) == 1 && args[18] == "0" {
		if v, _ := strconv.ParseInt(args[19], 10, 64); v > 0 {
			b.stalls = append(b.stalls, v)
		}
		if v, _ := strconv.ParseInt(args[20], 10, 64); v > 0 {
			b.alives = append(b.alives, v)
		}
	}
	out := []int64{1}
	for range keys {
		out = append(out, 0, 0, fleetClosed, 0, 0, 0, 0, 0, b.thresholdUS, b.suspect)
	}
	return out, nil
}

func (b *stallBackend) reports() (stalls, alives []int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]int64(nil), b.stalls...), append([]int64(nil), b.alives...)
}

// TestStallWatch: a process with a limiter arms its watch at a call's
// deposit with the threshold the fleet gave; an attempt that takes longer
// with no outcome in between is reported at once (the sync that follows
// carries its age), one that answers in time is not; a success after a
// suspicion the process heard (on the channel) is reported at once, each
// one (the fleet's rate is unknown here: below 100 a second, every
// success is reported), until the suspicion is cleared.
func TestStallWatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		be := &stallBackend{thresholdUS: 150_000}
		f := mustNew(t, be, Config{Name: "stall", SyncEvery: time.Hour, Limit: &limit.Config{}})
		p := policy(t, f, "api", retry.WithMaxAttempts(1))
		time.Sleep(time.Millisecond)
		synctest.Wait() // the first sync gave the threshold
		call := func(d time.Duration) {
			t.Helper()
			if err := p.Do(context.Background(), func(context.Context, int) error {
				time.Sleep(d)
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			synctest.Wait()
		}
		call(100 * time.Millisecond)
		if stalls, _ := be.reports(); len(stalls) != 0 {
			t.Fatalf("an attempt that answered in 100 ms was reported as a stall: %v", stalls)
		}
		time.Sleep(time.Second)
		call(400 * time.Millisecond)
		stalls, _ := be.reports()
		if len(stalls) != 1 || stalls[0] != 150_000 {
			t.Fatalf("stall reports %v µs, want [150000] (one, sent when the watch fired)", stalls)
		}

		za := int64(1_000_000)
		f.heard("s " + strconv.FormatInt(za, 10) + " " + f.keyPrefix + "api")
		f.heard("s 5 " + f.keyPrefix + "other") // a host it does not track: ignored
		call(10 * time.Millisecond)
		call(10 * time.Millisecond)
		if _, alives := be.reports(); !slices.Equal(alives, []int64{za, za}) {
			t.Fatalf("alive reports %v, want [%d %d] (each success, for the suspicion heard)", alives, za, za)
		}
		f.heard("s " + strconv.FormatInt(za+10, 10) + " " + f.keyPrefix + "api")
		f.heard("c " + strconv.FormatInt(za+20, 10) + " " + f.keyPrefix + "api")
		call(10 * time.Millisecond)
		if _, alives := be.reports(); len(alives) != 2 {
			t.Fatalf("a success after the suspicion was cleared was reported: %v", alives)
		}
	})
}
