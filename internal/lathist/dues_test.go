package lathist

import (
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// TestDues: at 500 races a second with 5% of them reaching their delay,
// every due race is allowed by a bound of 15%; when every race reaches it
// (a stall), the due races are allowed only until they are 15% of the last
// second's races; once the stall is over, within about a second, they are
// allowed again.
func TestDues(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := NewDues(time.Second)
		const share, floor = 0.15, 5
		tick := 2 * time.Millisecond
		refused := 0
		for i := range 5000 { // 10 s, 5% due, each race over before the next
			d.Start(time.Now())
			if i%20 == 0 && !d.Due(share, floor) {
				refused++
			}
			d.End(i%20 == 0)
			time.Sleep(tick)
		}
		if refused != 0 {
			t.Errorf("5%% of races due: %d refused, want 0", refused)
		}
		allowed := 0
		for range 500 { // 1 s, every race due, none ends
			d.Start(time.Now())
			if d.Due(share, floor) {
				allowed++
			}
			time.Sleep(tick)
		}
		if allowed == 0 || allowed > 75 {
			t.Errorf("every race due for 1 s at 500/s: %d allowed, want 1 to 75 (15%% of 500)", allowed)
		}
		for range 500 { // the stall is over: its races end
			d.End(true)
		}
		back := time.Duration(-1)
		for i := range 1000 { // 2 s, 5% due again
			d.Start(time.Now())
			if i%20 == 0 && d.Allows(share, floor) && back < 0 {
				back = time.Duration(i) * tick
			}
			d.End(false)
			time.Sleep(tick)
		}
		if back < 0 || back > 1100*time.Millisecond {
			t.Errorf("after the stall, due races allowed again after %v, want within 1.1 s", back)
		}
	})
}

// TestDuesFloor: with few races, up to floor due races a period are
// allowed whatever their share.
func TestDuesFloor(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := NewDues(time.Second)
		allowed := 0
		for range 10 {
			d.Start(time.Now())
			if d.Due(0.15, 5) {
				allowed++
			}
		}
		if allowed != 5 {
			t.Errorf("10 races, all due: %d allowed, want the floor 5", allowed)
		}
		for range 10 {
			d.End(true)
		}
		time.Sleep(2 * time.Second) // both periods gone
		d.Start(time.Now())
		if !d.Due(0.15, 1) {
			t.Error("2 s later, the only due race of its period refused with a floor of 1; want the older periods forgotten")
		}
	})
}

// TestDuesFloorAtOnce: 10 races in flight that reach their delay at the
// same instant on goroutines of their own get the floor (5) between them,
// whatever the order in which they count (the period's count and the
// in-flight count taken apart let each see the others in one of them, and
// as few as one went; seen in CI under -race).
func TestDuesFloorAtOnce(t *testing.T) {
	for round := range 200 {
		d := NewDues(time.Second)
		for range 10 {
			d.Start(time.Now())
		}
		var allowed sync.WaitGroup
		var mu sync.Mutex
		n := 0
		gate := make(chan struct{})
		for range 10 {
			allowed.Go(func() {
				<-gate
				if d.Due(0.15, 5) {
					mu.Lock()
					n++
					mu.Unlock()
				}
			})
		}
		close(gate)
		allowed.Wait()
		if n != 5 {
			t.Fatalf("round %d: 10 races due at once: %d allowed, want the floor 5", round, n)
		}
	}
}

// TestDuesInFlight: at 500 races a second, each over within 10 ms and 5%
// of them reaching their delay (over 10 ms later), every due race is
// allowed. Then 20 races start within 4 ms and all reach their delay
// without ending (a queue behind a short stall): they are few against the
// last second's 500 races (75 may reach their delay), but most of the
// races in flight, and only the floor of them (5) is allowed. Once they
// have ended, a due race is allowed at once.
func TestDuesInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := NewDues(time.Second)
		const share, floor = 0.15, 5
		type race struct {
			end time.Time
			due bool
		}
		var flight []race
		step := func() { // ends the races whose time has come
			now := time.Now()
			kept := flight[:0]
			for _, r := range flight {
				if r.end.After(now) {
					kept = append(kept, r)
					continue
				}
				d.End(r.due)
			}
			flight = kept
		}
		refused := 0
		for i := range 1000 { // 2 s
			step()
			d.Start(time.Now())
			r := race{end: time.Now().Add(10 * time.Millisecond)}
			if i%20 == 0 {
				r.due, r.end = true, r.end.Add(10*time.Millisecond)
				if !d.Due(share, floor) {
					refused++
				}
			}
			flight = append(flight, r)
			time.Sleep(2 * time.Millisecond)
		}
		if refused != 0 {
			t.Errorf("5%% of races due, in flight 20 ms: %d refused, want 0", refused)
		}
		for range len(flight) { // the steady races end
			step()
			time.Sleep(time.Millisecond)
		}
		for range 20 {
			d.Start(time.Now())
			time.Sleep(200 * time.Microsecond)
		}
		allowed := 0
		for range 20 {
			if d.Due(share, floor) {
				allowed++
			}
		}
		if allowed != floor {
			t.Errorf("20 races due at once, none ended: %d allowed, want the floor %d", allowed, floor)
		}
		for range 20 {
			d.End(true)
		}
		d.Start(time.Now())
		if !d.Due(share, floor) {
			t.Error("after the burst's races ended, a due race refused; want it allowed at once")
		}
	})
}

// TestDuesSaturates: the counts stop at their maximum instead of wrapping.
func TestDuesSaturates(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := NewDues(time.Hour)
		for range countMax + 10 {
			d.Start(time.Now())
			d.read(time.Now(), 1)
		}
		if s, u := d.read(time.Now(), 0); s != countMax || u != countMax {
			t.Errorf("counts %v and %v after %d of each, want both %d", s, u, countMax+10, countMax)
		}
	})
}

// TestDuesConcurrent: counts from many goroutines are all kept (run with
// -race).
func TestDuesConcurrent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := NewDues(time.Hour)
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				for range 1000 {
					d.Start(time.Now())
					d.Due(1, 0)
				}
			})
		}
		wg.Wait()
		if s, u := d.read(time.Now(), 0); s != 8000 || u != 8000 {
			t.Errorf("counts %v started, %v due; want 8000 and 8000", s, u)
		}
	})
}

func TestDuesAllocs(t *testing.T) {
	d := NewDues(time.Second)
	if n := testing.AllocsPerRun(1000, func() {
		d.Start(time.Now())
		d.Due(0.15, 5)
		d.Queued(time.Millisecond)
		d.Answered(true)
		d.Answered(false)
		d.End(true)
	}); n != 0 {
		t.Errorf("Start, Due, Queued, Answered and End allocate %v times, want 0", n)
	}
}

func TestLookAgain(t *testing.T) {
	tests := []struct {
		delay time.Duration
		looks int
		want  time.Duration
	}{
		{10 * time.Millisecond, 0, 5 * time.Millisecond},
		{10 * time.Millisecond, 5, 5 * time.Millisecond},
		{10 * time.Millisecond, 6, 10 * time.Millisecond},
		{10 * time.Millisecond, 7, 20 * time.Millisecond},
		{10 * time.Millisecond, 9, 80 * time.Millisecond},
		{10 * time.Millisecond, 1000, time.Minute},
		{time.Microsecond, 0, time.Millisecond},
		{time.Hour, 0, time.Minute},
		{time.Duration(1 << 62), 40, time.Minute},
	}
	for _, tt := range tests {
		if got := LookAgain(tt.delay, tt.looks); got != tt.want {
			t.Errorf("LookAgain(%v, %d) = %v, want %v", tt.delay, tt.looks, got, tt.want)
		}
	}
}

// TestDuesQueued: one late answer is a request slow on its own, two in a
// row a queue; an answer on time, or half a delay with no late one, ends
// it.
func TestDuesQueued(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const delay = 10 * time.Millisecond
		d := NewDues(time.Second)
		steps := []struct {
			name   string
			late   []bool // answers, in order
			wait   time.Duration
			queued bool
		}{
			{"none yet", nil, 0, false},
			{"one late", []bool{true}, 0, false},
			{"two late in a row", []bool{true}, 0, true},
			{"a third", []bool{true}, delay / 2, true},
			{"half a delay and a bit with none", nil, time.Millisecond, false},
			{"late again, the run goes on", []bool{true}, 0, true},
			{"one on time", []bool{false}, 0, false},
			{"late, on time, late", []bool{true, false, true}, 0, false},
			{"and late", []bool{true}, 0, true},
		}
		for _, s := range steps {
			for _, l := range s.late {
				d.Answered(l)
			}
			time.Sleep(s.wait)
			if got := d.Queued(delay); got != s.queued {
				t.Errorf("%s: Queued %v, want %v", s.name, got, s.queued)
			}
		}
	})
}
