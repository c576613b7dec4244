package httpretry

import (
	"fmt"
	"sync"
	"testing"
)

func TestHostsBoundedFIFO(t *testing.T) {
	made := 0
	h := newHosts(2, func(name string) (*host, error) { made++; return &host{}, nil })
	a1, _ := h.get("A.example:80")
	if a2, _ := h.get("a.example:80"); a2 != a1 {
		t.Errorf("get(a.example) after get(A.example) made a new host; want the same (case-insensitive)")
	}
	h.get("b.example")
	h.get("c.example") // evicts a, the oldest
	if n := h.len(); n != 2 {
		t.Errorf("len = %d after 3 hosts in a table of 2, want 2", n)
	}
	if a3, _ := h.get("a.example:80"); a3 == a1 {
		t.Errorf("get(a.example) after eviction returned the old state")
	}
	if made != 4 {
		t.Errorf("made %d host states, want 4 (a, b, c, a again)", made)
	}
}

func TestHostsConcurrent(t *testing.T) {
	h := newHosts(8, func(name string) (*host, error) { return &host{}, nil })
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 200 {
				if _, err := h.get(fmt.Sprintf("h%d", (g*7+i)%20)); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	if n := h.len(); n > 8 {
		t.Errorf("len = %d, above the bound 8", n)
	}
}

func TestHostsMakeError(t *testing.T) {
	boom := fmt.Errorf("boom")
	h := newHosts(2, func(name string) (*host, error) { return nil, boom })
	if _, err := h.get("x"); err != boom {
		t.Errorf("get = %v, want the make error", err)
	}
	if h.len() != 0 {
		t.Errorf("a failed make was kept")
	}
}
