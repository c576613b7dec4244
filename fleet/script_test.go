package fleet

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strconv"
	"testing"

	"github.com/redis/go-redis/v9"
)

// scriptCase is a random but reproducible run of the script: settings and
// a sequence of calls at explicit times.
type scriptCase struct {
	set   settings
	keys  []string
	calls []scriptCall
}

type scriptCall struct {
	keys []string
	args []string
}

// byteSource draws numbers from fuzz input, then zeros.
type byteSource struct{ b []byte }

func (s *byteSource) next(n uint64) uint64 {
	if n == 0 {
		return 0
	}
	var x uint64
	if len(s.b) >= 2 {
		x = uint64(binary.LittleEndian.Uint16(s.b))
		s.b = s.b[2:]
	} else if len(s.b) == 1 {
		x = uint64(s.b[0])
		s.b = s.b[1:]
	}
	return x % n
}

// genCase builds a case of n calls on keys under prefix, drawing from next
// (which returns a number in [0, n)).
func genCase(next func(n uint64) uint64, prefix string, n int) scriptCase {
	pick := func(vs ...int64) int64 { return vs[next(uint64(len(vs)))] }
	c := scriptCase{set: settings{
		sliceUS:  pick(1000, 7000, 100_000, 1_000_000),
		slices:   pick(1, 2, 3, 10, 60),
		ratio:    []float64{0, 0.1, 0.2, 0.5, 1, 1.0 / 3}[next(6)],
		reserve:  []float64{0, 1, 10, 0.5, 2.7}[next(5)],
		bucketUS: pick(1000, 3000, 250_000, 1_000_000),
		buckets:  pick(1, 2, 5, 10),
		fratio:   []float64{0.5, 0.1, 1, 0.75}[next(4)],
		minCalls: pick(1, 5, 20),
		ttlMS:    60_000,
		probeUS:  pick(1000, 500_000, 1_000_000),
		rounds:   pick(1, 2, 3),
	}}
	for i := range 3 {
		c.keys = append(c.keys, prefix+"h"+strconv.Itoa(i))
	}
	now := int64(1_700_000_000_000_000) + int64(next(1<<16))
	epochs := []int64{0, 1, 2, 3}
	// incs holds each key's incarnation (its time when a call first
	// touched it), so that most returns name the right one.
	incs := map[string]int64{}
	touch := func(keys []string) {
		for _, k := range keys {
			if incs[k] == 0 {
				incs[k] = now
			}
		}
	}
	for range n {
		// Time moves on by up to about two slices, sometimes back.
		switch next(8) {
		case 0:
			now -= int64(next(uint64(c.set.sliceUS)))
		case 1, 2:
		default:
			now += int64(next(uint64(2*max(c.set.sliceUS, c.set.bucketUS))) + 1)
		}
		base := c.set.args("", now)
		switch next(4) {
		case 0, 1:
			keys := c.keys[:1+next(uint64(len(c.keys)))]
			base[0] = "s"
			touch(keys)
			for _, k := range keys {
				h := syncHost{
					requests:  next(40),
					successes: next(30),
					failures:  next(30),
					seen:      epochs[next(uint64(len(epochs)))],
					close:     next(4) == 0,
				}
				for range next(3) {
					cur := now / c.set.sliceUS
					h.returns = append(h.returns, returned{slot{cur - int64(next(uint64(c.set.slices)+2)) + 1, incs[k] + int64(next(4)/3)}, int64(next(5))})
				}
				base = appendSync(base, h)
			}
			c.calls = append(c.calls, scriptCall{keys, base})
		case 2:
			base[0] = "l"
			keys := c.keys[next(uint64(len(c.keys))):][:1]
			touch(keys)
			c.calls = append(c.calls, scriptCall{keys, append(base, itoa(int64(next(9))+1))})
		case 3:
			base[0] = "p"
			keys := c.keys[next(uint64(len(c.keys))):][:1]
			touch(keys)
			c.calls = append(c.calls, scriptCall{keys, append(base, itoa(epochs[next(4)]))})
		}
	}
	return c
}

// runCase runs c on the model and on Redis, and reports the first
// difference in a reply or in the hashes left behind.
func runCase(t *testing.T, rc *redis.Client, c scriptCase) {
	t.Helper()
	ctx := context.Background()
	m := newModel()
	script := redis.NewScript(scriptSource)
	for i, call := range c.calls {
		want, err := m.eval(call.keys, call.args)
		if err != nil {
			t.Fatalf("call %d: model: %v", i, err)
		}
		args := make([]any, len(call.args))
		for j, a := range call.args {
			args[j] = a
		}
		got, err := script.Run(ctx, rc, call.keys, args...).Int64Slice()
		if err != nil {
			t.Fatalf("call %d (%v %v): redis: %v", i, call.keys, call.args, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("call %d (%v %v): script replied %v, model %v", i, call.keys, call.args, got, want)
		}
	}
	for _, k := range c.keys {
		raw, err := rc.HGetAll(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]int64{}
		for f, v := range raw {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatalf("%s field %s = %q: not an integer", k, f, v)
			}
			got[f] = n
		}
		want := m.hashes[k]
		if want == nil {
			want = map[string]int64{}
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("hash %s: redis holds %v, model %v", k, got, want)
		}
	}
}

// TestScriptMatchesModel holds the Lua script equal to its Go model, reply
// for reply and field for field, over seeded random runs.
func TestScriptMatchesModel(t *testing.T) {
	rc := redisClient(t)
	for seed := range uint64(40) {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			prefix := keyPrefix + "{" + uniqueName(t) + "}:"
			t.Cleanup(func() { rc.Del(context.Background(), prefix+"h0", prefix+"h1", prefix+"h2") })
			r := rand.New(rand.NewPCG(seed, 7))
			runCase(t, rc, genCase(func(n uint64) uint64 {
				if n == 0 {
					return 0
				}
				return r.Uint64N(n)
			}, prefix, 300))
		})
	}
}

// FuzzScriptMatchesModel is TestScriptMatchesModel with runs drawn from the
// fuzzer's input.
func FuzzScriptMatchesModel(f *testing.F) {
	f.Add([]byte{0})
	f.Add([]byte("a sequence of calls with some returns and closes"))
	f.Add(make([]byte, 200))
	rc := redisClient(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		prefix := keyPrefix + "{" + uniqueName(t) + "}:"
		defer rc.Del(context.Background(), prefix+"h0", prefix+"h1", prefix+"h2")
		src := &byteSource{data}
		runCase(t, rc, genCase(src.next, prefix, 1+len(data)/8))
	})
}

// TestScriptServerClock runs the script on the server's clock (TIME): the
// reply's time is the server's, and a window made of it counts.
func TestScriptServerClock(t *testing.T) {
	rc := redisClient(t)
	ctx := context.Background()
	name := uniqueName(t)
	cleanup(t, rc, name)
	key := keyPrefix + "{" + name + "}:h"
	s := settings{sliceUS: 1_000_000, slices: 10, ratio: 0.1, reserve: 10, bucketUS: 1_000_000, buckets: 10,
		fratio: 0.5, minCalls: 20, ttlMS: 60_000, probeUS: 1_000_000, rounds: 1}
	args := appendSync(s.args("s", 0), syncHost{requests: 100})
	a := make([]any, len(args))
	for i := range args {
		a[i] = args[i]
	}
	v, err := redis.NewScript(scriptSource).Run(ctx, rc, []string{key}, a...).Int64Slice()
	if err != nil {
		t.Fatal(err)
	}
	tm, err := rc.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	if d := tm.UnixMicro() - v[0]; d < 0 || d > 5_000_000 {
		t.Errorf("script time %d, server time %d: not the server's clock", v[0], tm.UnixMicro())
	}
	if v[1] != 100 {
		t.Errorf("window requests = %d after a deposit of 100, want 100", v[1])
	}
	if ttl := rc.PTTL(ctx, key).Val(); ttl <= 0 || ttl.Milliseconds() > s.ttlMS {
		t.Errorf("key TTL %v, want in (0, %dms]", ttl, s.ttlMS)
	}
}
