package fleet

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// model is a pure-Go model of the script: the same arithmetic, step by
// step, on a map of hashes. The differential tests hold it equal to the
// script on a real Redis; the synctest tests run fleets on it.
type model struct {
	hashes map[string]map[string]int64
}

func newModel() *model { return &model{hashes: map[string]map[string]int64{}} }

// fmod is Lua's modulo: the result has the sign of b.
func fmod(a, b int64) int64 {
	r := a % b
	if r != 0 && (r < 0) != (b < 0) {
		r += b
	}
	return r
}

// fdiv is Lua's math.floor(a / b) for the integers the script divides.
func fdiv(a, b int64) int64 {
	q := a / b
	if (a%b != 0) && ((a < 0) != (b < 0)) {
		q--
	}
	return q
}

type modelArgs struct {
	argv []string
	err  error
}

func (a *modelArgs) int(i int) int64 {
	if i < 1 || i > len(a.argv) {
		a.err = fmt.Errorf("ARGV[%d] missing", i)
		return 0
	}
	v, err := strconv.ParseInt(a.argv[i-1], 10, 64)
	if err != nil && a.err == nil {
		a.err = err
	}
	return v
}

func (a *modelArgs) float(i int) float64 {
	if i < 1 || i > len(a.argv) {
		a.err = fmt.Errorf("ARGV[%d] missing", i)
		return 0
	}
	v, err := strconv.ParseFloat(a.argv[i-1], 64)
	if err != nil && a.err == nil {
		a.err = err
	}
	return v
}

// eval runs the script's logic on m, as EVAL with keys and argv would.
func (m *model) eval(keys, argv []string) ([]int64, error) {
	a := &modelArgs{argv: argv}
	mode := ""
	if len(argv) > 0 {
		mode = argv[0]
	}
	now := a.int(2)
	if now <= 0 {
		return nil, errors.New("model: needs an explicit time")
	}
	sliceUS, slices := a.int(3), a.int(4)
	ratio, reserve := a.float(5), a.float(6)
	bucketUS, buckets := a.int(7), a.int(8)
	fratio, minCalls := a.float(9), a.int(10)
	probeUS, rounds := a.int(12), a.int(13)
	a.int(11) // ttl: not modelled
	if a.err != nil {
		return nil, a.err
	}

	var h map[string]int64
	get := func(f string) int64 { return h[f] }
	set := func(f string, v int64) { h[f] = v }
	load := func(key string) {
		if m.hashes[key] == nil {
			m.hashes[key] = map[string]int64{}
		}
		h = m.hashes[key]
		if get("t") > now {
			now = get("t")
		} else {
			set("t", now)
		}
		if get("in") == 0 {
			set("in", now)
		}
	}
	f := func(p string, i int64) string { return p + strconv.FormatInt(i, 10) }
	ringSum := func(t, a, b string, cur, n int64) (x, y int64) {
		for s := cur - n + 1; s <= cur; s++ {
			i := fmod(s, n)
			if get(f(t, i)) == s {
				x += get(f(a, i))
				y += get(f(b, i))
			}
		}
		return x, y
	}
	ringSlot := func(t, a, b string, cur, n int64) int64 {
		i := fmod(cur, n)
		if get(f(t, i)) != cur {
			set(f(t, i), cur)
			set(f(a, i), 0)
			set(f(b, i), 0)
		}
		return i
	}
	budgetWindow := func(cur int64) (q, r int64) { return ringSum("bn", "bq", "br", cur, slices) }
	budgetSlot := func(cur int64) int64 { return ringSlot("bn", "bq", "br", cur, slices) }
	outcomeWindow := func(cur int64) (calls, fails int64) {
		succ, fails := ringSum("on", "os", "of", cur, buckets)
		return succ + fails, fails
	}
	flip := func(st int64) {
		if st == 1 && get("st") == 0 {
			set("so", now) // when the fleet's breaker opened (for a slow probe, see rate_probed)
		}
		set("st", st)
		set("ep", get("ep")+1)
		for i := range buckets {
			if get(f("on", i)) != -1 {
				set(f("on", i), -1)
			}
		}
	}

	var out []int64
	switch mode {
	case "s":
		ai := 14
		for _, key := range keys {
			load(key)
			cur, bcur := fdiv(now, sliceUS), fdiv(now, bucketUS)
			dq, ds, df := a.int(ai), a.int(ai+1), a.int(ai+2)
			seen, cl, nret := a.int(ai+3), a.int(ai+4), a.int(ai+5)
			ai += 6
			if a.err != nil {
				return nil, a.err
			}
			if dq > 0 {
				i := budgetSlot(cur)
				set(f("bq", i), get(f("bq", i))+dq)
			}
			for range nret {
				s, inc, n := a.int(ai), a.int(ai+1), a.int(ai+2)
				ai += 3
				i := fmod(s, slices)
				if s <= cur && s > cur-slices && get(f("bn", i)) == s && get("in") == inc {
					set(f("br", i), max(0, get(f("br", i))-n))
				}
			}
			// The model covers hosts without a limit (its flag "0"); the
			// fleet's limit has tests of its own (limit_test.go).
			if lf := a.int(ai); lf != 0 && a.err == nil {
				return nil, fmt.Errorf("the model has no fleet limit (flag %d)", lf)
			}
			ai++
			if a.err != nil {
				return nil, a.err
			}
			if cl == 1 && get("st") == 1 && seen == get("ep") {
				flip(0)
			}
			if (ds > 0 || df > 0) && get("st") == 0 && (seen == get("ep") || seen == -1) {
				i := ringSlot("on", "os", "of", bcur, buckets)
				set(f("os", i), get(f("os", i))+ds)
				set(f("of", i), get(f("of", i))+df)
				calls, fails := outcomeWindow(bcur)
				bfails := get(f("of", i))
				bcalls := get(f("os", i)) + bfails
				if (fails > 0 && calls >= minCalls && float64(fails) >= fratio*float64(calls)) ||
					(bfails > 0 && bcalls >= minCalls && float64(bfails) >= fratio*float64(bcalls)) {
					flip(1)
				}
			}
			q, r := budgetWindow(cur)
			calls, fails := outcomeWindow(bcur)
			out = append(out, q, r, get("st"), get("ep"), calls, fails, 0, 0)
		}
	case "l":
		load(keys[0])
		want := a.int(14)
		if a.err != nil {
			return nil, a.err
		}
		cur := fdiv(now, sliceUS)
		q, r := budgetWindow(cur)
		k := min(want, int64(math.Floor(float64(ratio*float64(q))+reserve))-r)
		if get("st") == 1 {
			k = 0
		}
		if k > 0 {
			i := budgetSlot(cur)
			set(f("br", i), get(f("br", i))+k)
			r += k
		} else {
			k = 0
		}
		out = []int64{k, cur, (cur+1)*sliceUS - now, q, r, get("st"), get("ep"), get("in")}
	case "p":
		load(keys[0])
		seen := a.int(14)
		if a.err != nil {
			return nil, a.err
		}
		granted := int64(0)
		switch {
		case get("st") == 1:
			slot := fdiv(now, max(probeUS/rounds, 1))
			if get("ps") != slot {
				set("ps", slot)
				granted = 1
			}
		case seen == get("ep"):
			granted = 1
		}
		out = []int64{granted, get("st"), get("ep")}
	default:
		return nil, fmt.Errorf("model: unknown mode %q", mode)
	}
	return append([]int64{now}, out...), nil
}

// modelBackend runs fleets on a shared model, with the time of the
// process's clock (a synctest bubble's fake time in the tests that use it),
// and faults the test switches on and off.
type modelBackend struct {
	mu    sync.Mutex
	m     *model
	now   func() time.Time
	down  atomic.Bool  // every call fails
	delay atomic.Int64 // every call takes this long (ns) before it runs, whatever its context
	calls atomic.Int64 // calls made
	modes [128]atomic.Int64
}

var errDown = errors.New("model: down")

func newModelBackend() *modelBackend { return &modelBackend{m: newModel(), now: time.Now} }

func (b *modelBackend) eval(ctx context.Context, keys, args []string) ([]int64, error) {
	b.calls.Add(1)
	if len(args) > 0 && len(args[0]) == 1 {
		b.modes[args[0][0]&127].Add(1)
	}
	if d := time.Duration(b.delay.Load()); d > 0 {
		time.Sleep(d) // like a client that ignores the context's deadline
	}
	if b.down.Load() {
		return nil, errDown
	}
	args = append([]string(nil), args...)
	args[1] = strconv.FormatInt(b.now().UnixMicro(), 10)
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.m.eval(keys, args)
}

// mode returns the calls of one mode ('s', 'l' or 'p') made so far.
func (b *modelBackend) mode(c byte) int64 { return b.modes[c].Load() }
