package waitq

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// check verifies l's links at every level: each level is in deadline
// order, its prev and next links agree, its head and tail are its ends,
// and a waiter on a level is on every level below it. It returns level 0's
// waiters, front to back.
func check[T any](t *testing.T, l *List[T]) []*Waiter[T] {
	t.Helper()
	var all []*Waiter[T]
	var prev *Waiter[T]
	for w := l.head; w != nil; prev, w = w, w.next {
		if w.prev != prev || w.list != l {
			t.Fatalf("level 0: broken link at deadline %v", w.deadline)
		}
		if prev != nil && prev.deadline > w.deadline {
			t.Fatalf("level 0: %v after %v", w.deadline, prev.deadline)
		}
		all = append(all, w)
	}
	if l.tail != prev || len(all) != l.n {
		t.Fatalf("level 0: tail or count wrong (%d linked, n %d)", len(all), l.n)
	}
	pos := make(map[*Waiter[T]]int, len(all))
	for i, w := range all {
		pos[w] = i
	}
	below := all
	for lv := 1; lv < levels; lv++ {
		var on []*Waiter[T]
		var prev *Waiter[T]
		for w := l.heads[lv]; w != nil; prev, w = w, w.up[lv-1].next {
			if len(w.up) < lv || w.up[lv-1].prev != prev {
				t.Fatalf("level %d: broken link at deadline %v", lv, w.deadline)
			}
			if prev != nil && pos[prev] >= pos[w] {
				t.Fatalf("level %d: not in the list's order", lv)
			}
			on = append(on, w)
		}
		if l.tails[lv] != prev {
			t.Fatalf("level %d: tail wrong", lv)
		}
		for _, w := range below {
			if len(w.up) >= lv && !slices.Contains(on, w) {
				t.Fatalf("level %d: a waiter of %d levels is not on it", lv, len(w.up)+1)
			}
		}
		below = on
	}
	return all
}

// TestLanesAgainstAModel: random pushes (deadlines from a small range, so
// that many are equal, in any order), removals, pops and expiries keep
// every level's links right and level 0 in the order of a plain model:
// deadline, then arrival.
func TestLanesAgainstAModel(t *testing.T) {
	type item struct {
		w        *Waiter[int]
		deadline time.Duration
		seq      int
	}
	rng := rand.New(rand.NewPCG(1, 2))
	var l List[int]
	var model []item
	seq := 0
	for step := range 20_000 {
		switch op := rng.IntN(10); {
		case op < 6:
			w := &Waiter[int]{Value: seq}
			d := time.Duration(rng.IntN(200))
			if !l.Push(w, d) {
				t.Fatal("Push refused")
			}
			model = append(model, item{w, d, seq})
			seq++
		case op < 8 && len(model) > 0:
			i := rng.IntN(len(model))
			if !l.Remove(model[i].w) {
				t.Fatal("Remove of a waiter on the list")
			}
			model = slices.Delete(model, i, i+1)
		case op < 9:
			if w := l.PopFront(); w != nil {
				slices.SortStableFunc(model, func(a, b item) int { return int(a.deadline - b.deadline) })
				if model[0].w != w {
					t.Fatalf("PopFront: %d, want %d", w.Value, model[0].w.Value)
				}
				model = model[1:]
			}
		default:
			cut := time.Duration(rng.IntN(20))
			l.Expire(cut, func(*Waiter[int]) {})
			model = slices.DeleteFunc(model, func(it item) bool { return it.deadline < cut })
		}
		if step%97 == 0 || step > 19_900 {
			got := check(t, &l)
			slices.SortStableFunc(model, func(a, b item) int {
				if a.deadline != b.deadline {
					return int(a.deadline - b.deadline)
				}
				return a.seq - b.seq
			})
			if len(got) != len(model) {
				t.Fatalf("step %d: %d waiters, model %d", step, len(got), len(model))
			}
			for i := range got {
				if got[i] != model[i].w {
					t.Fatalf("step %d: position %d holds %d, want %d", step, i, got[i].Value, model[i].w.Value)
				}
			}
		}
	}
}

// A waiter removed and pushed again (a limiter's call that moves from one
// list to another) links at its new level, whatever its old one.
func TestLanesReuse(t *testing.T) {
	var a, b List[int]
	ws := make([]*Waiter[int], 500)
	for i := range ws {
		ws[i] = &Waiter[int]{Value: i}
		a.Push(ws[i], time.Duration(500-i))
	}
	for _, w := range ws {
		a.Remove(w)
		b.Push(w, time.Duration(w.Value%7))
	}
	check(t, &a)
	if got := check(t, &b); len(got) != len(ws) {
		t.Fatalf("%d waiters on the second list, want %d", len(got), len(ws))
	}
}
