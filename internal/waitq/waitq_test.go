package waitq_test

import (
	"math"
	"slices"
	"testing"
	"time"

	"github.com/stormguard/stormguard/internal/waitq"
)

// values returns l's values, front to back, checking the links both ways.
func values(t *testing.T, l *waitq.List[int]) []int {
	t.Helper()
	var out []int
	var last time.Duration = math.MinInt64
	for w := l.Front(); w != nil; w = w.Next() {
		if w.Deadline() < last {
			t.Fatalf("deadline %v after %v: list out of order", w.Deadline(), last)
		}
		last = w.Deadline()
		out = append(out, w.Value)
	}
	if len(out) != l.Len() {
		t.Fatalf("%d waiters linked, Len() = %d", len(out), l.Len())
	}
	return out
}

func push(t *testing.T, l *waitq.List[int], v int, deadline time.Duration) *waitq.Waiter[int] {
	t.Helper()
	w := &waitq.Waiter[int]{Value: v}
	if !l.Push(w, deadline) {
		t.Fatalf("Push(%d, %v) refused", v, deadline)
	}
	return w
}

// Earliest deadline first; equal deadlines in arrival order.
func TestOrder(t *testing.T) {
	var l waitq.List[int]
	push(t, &l, 0, 50)
	push(t, &l, 1, 40)
	push(t, &l, 2, 40)
	push(t, &l, 3, 60)
	push(t, &l, 4, 10)
	push(t, &l, 5, 40)
	if got, want := values(t, &l), []int{4, 1, 2, 5, 0, 3}; !slices.Equal(got, want) {
		t.Errorf("order %v, want %v", got, want)
	}
}

// A wait of the largest duration, added to a clock reading that is not
// zero, saturates: it sorts after a call with 5 s left instead of wrapping
// round to the front.
func TestDeadlineSaturates(t *testing.T) {
	var l waitq.List[int]
	now := time.Hour
	push(t, &l, 0, waitq.Deadline(now, 5*time.Second))
	push(t, &l, 1, waitq.Deadline(now, math.MaxInt64))
	push(t, &l, 2, waitq.Deadline(now, math.MaxInt64-time.Minute))
	if got, want := values(t, &l), []int{0, 1, 2}; !slices.Equal(got, want) {
		t.Errorf("order %v, want %v (unbounded waits last, in arrival order)", got, want)
	}
	if d := waitq.Deadline(now, math.MaxInt64); d != math.MaxInt64 {
		t.Errorf("Deadline(1h, MaxInt64) = %v, want MaxInt64", d)
	}
}

func TestRemovePopExpire(t *testing.T) {
	var l waitq.List[int]
	ws := make([]*waitq.Waiter[int], 6)
	for i := range ws {
		ws[i] = push(t, &l, i, time.Duration(i)*time.Second)
	}
	if !l.Remove(ws[2]) || l.Remove(ws[2]) || ws[2].Waiting() {
		t.Fatal("Remove(w) twice: want true, then false, and w not waiting")
	}
	if l.Push(ws[3], 0) {
		t.Error("Push of a waiter already in the list succeeded")
	}
	var other waitq.List[int]
	if other.Remove(ws[3]) {
		t.Error("Remove of a waiter of another list succeeded")
	}
	if w := l.PopFront(); w != ws[0] || w.Waiting() {
		t.Errorf("PopFront() = %v, want waiter 0 off the list", w.Value)
	}
	var failed []int
	l.Expire(4*time.Second, func(w *waitq.Waiter[int]) {
		if w.Waiting() {
			t.Errorf("Expire handed waiter %d still on the list", w.Value)
		}
		failed = append(failed, w.Value)
	})
	if want := []int{1, 3}; !slices.Equal(failed, want) {
		t.Errorf("Expire(4s) failed %v, want %v (deadlines before 4 s)", failed, want)
	}
	if got, want := values(t, &l), []int{4, 5}; !slices.Equal(got, want) {
		t.Errorf("left %v, want %v", got, want)
	}
	l.PopFront()
	l.PopFront()
	if l.PopFront() != nil || l.Front() != nil || l.Len() != 0 {
		t.Error("empty list: PopFront, Front want nil and Len 0")
	}
	push(t, &l, 7, 0) // usable again once empty
	if got := values(t, &l); !slices.Equal(got, []int{7}) {
		t.Errorf("after emptying and one Push: %v", got)
	}
}

func TestMax(t *testing.T) {
	l := waitq.List[int]{Max: 2}
	push(t, &l, 0, 1)
	push(t, &l, 1, 1)
	if !l.Full() || l.Push(&waitq.Waiter[int]{}, 0) {
		t.Fatal("a third waiter in a list of Max 2 was accepted")
	}
	l.PopFront()
	if l.Full() {
		t.Fatal("Full after a waiter left")
	}
	push(t, &l, 2, 0)
}

// FuzzDeadlines pushes waiters whose deadlines are sums of arbitrary clock
// readings and waits (the time inputs a caller controls), removes some,
// expires some, and checks that the list stays in deadline order with
// arrival order among equal deadlines, and that a deadline is never before
// its clock reading.
func FuzzDeadlines(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 0xff, 0x80, 7, 9})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, 1, 0, 0, 0, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, ops []byte) {
		var l waitq.List[int]
		type entry struct {
			w   *waitq.Waiter[int]
			seq int
		}
		var live []entry
		seq := 0
		for len(ops) >= 3 {
			op, a, b := ops[0], ops[1], ops[2]
			ops = ops[3:]
			switch op % 4 {
			case 0, 1: // push at now + wait; both may be huge or negative
				now := time.Duration(int64(a)<<56 | int64(b)<<8)
				wait := time.Duration(int64(b)<<55 ^ int64(a)*int64(time.Second))
				if op&0x80 != 0 {
					wait = math.MaxInt64 - time.Duration(a)
				}
				d := waitq.Deadline(now, wait)
				if wait >= 0 && d < now {
					t.Fatalf("Deadline(%v, %v) = %v, before now", now, wait, d)
				}
				w := &waitq.Waiter[int]{Value: seq}
				if !l.Push(w, d) {
					t.Fatal("Push to an unbounded list refused")
				}
				live = append(live, entry{w, seq})
				seq++
			case 2: // remove one
				if len(live) > 0 {
					i := int(a) % len(live)
					if !l.Remove(live[i].w) {
						t.Fatal("Remove of a waiting waiter failed")
					}
					live = slices.Delete(live, i, i+1)
				}
			case 3: // expire the front
				cutoff := time.Duration(int64(a)<<56 | int64(b))
				l.Expire(cutoff, func(w *waitq.Waiter[int]) {
					if w.Deadline() >= cutoff {
						t.Fatalf("Expire(%v) failed a waiter with deadline %v", cutoff, w.Deadline())
					}
					live = slices.DeleteFunc(live, func(e entry) bool { return e.w == w })
				})
				if f := l.Front(); f != nil && f.Deadline() < cutoff {
					t.Fatalf("after Expire(%v) the front has deadline %v", cutoff, f.Deadline())
				}
			}
			// In order: deadline, then arrival.
			prev := (*waitq.Waiter[int])(nil)
			n := 0
			for w := l.Front(); w != nil; w = w.Next() {
				if prev != nil && (w.Deadline() < prev.Deadline() || w.Deadline() == prev.Deadline() && w.Value < prev.Value) {
					t.Fatalf("waiter %d (deadline %v) after waiter %d (deadline %v)", w.Value, w.Deadline(), prev.Value, prev.Deadline())
				}
				prev = w
				n++
			}
			if n != len(live) || l.Len() != n {
				t.Fatalf("%d linked, Len %d, %d expected", n, l.Len(), len(live))
			}
		}
	})
}

// BenchmarkPushBehindMany: a call with a short deadline arrives behind
// 100,000 waiting calls with long ones (mixed timeouts) and leaves: its
// Push must not walk past all of them (the express lanes place it in
// O(log n)). BenchmarkPushAtBack is the common case, deadlines growing with
// arrival.
func BenchmarkPushBehindMany(b *testing.B) {
	var l waitq.List[int]
	for i := range 100_000 {
		l.Push(&waitq.Waiter[int]{Value: i}, time.Hour+time.Duration(i))
	}
	w := &waitq.Waiter[int]{}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		l.Push(w, time.Duration(i%1000))
		l.Remove(w)
	}
}

func BenchmarkPushAtBack(b *testing.B) {
	var l waitq.List[int]
	ws := make([]waitq.Waiter[int], 1024)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		w := &ws[i%len(ws)]
		if w.Waiting() {
			l.Remove(w)
		}
		l.Push(w, time.Duration(i))
	}
}
