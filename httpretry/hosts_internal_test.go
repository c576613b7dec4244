package httpretry

import (
	"strings"
	"testing"
)

// The table itself is tested in internal/guards; here, what httpretry adds:
// hosts are case-insensitive.
func TestHostsCaseInsensitive(t *testing.T) {
	made := 0
	h := newHosts(2, func(name string) (*host, error) { made++; return &host{Name: name}, nil })
	a1, _ := h.get("A.example:80")
	if a2, _ := h.get("a.example:80"); a2 != a1 || a1.Name != "a.example:80" {
		t.Errorf("get(a.example) after get(A.example) = %+v, %+v; want the same, lower-cased", a2, a1)
	}
	if made != 1 || h.len() != 1 || len(h.all()) != 1 {
		t.Errorf("made %d states, len %d; want 1 each", made, h.len())
	}
}

// lowerHost is strings.ToLower with a short pass for a name already in
// lower case; the edges of the upper-case range and non-ASCII names go the
// long way.
func TestLowerHost(t *testing.T) {
	for _, name := range []string{
		"", "example.test", "example.test:8080", "[::1]:443", "@[`{", "A", "Z", "EXAMPLE.test",
		"example.tesT", "exämple.test", "EXÄMPLE.TEST", "\xff", "İ.example", "a\x80b",
	} {
		if got, want := lowerHost(name), strings.ToLower(name); got != want {
			t.Errorf("lowerHost(%q) = %q, want %q", name, got, want)
		}
	}
	name := strings.Repeat("example.", 4) + "test"
	if allocs := testing.AllocsPerRun(100, func() { _ = lowerHost(name) }); allocs != 0 {
		t.Errorf("lowerHost of a lower-case name: %v allocations, want 0", allocs)
	}
}

func FuzzLowerHost(f *testing.F) {
	for _, s := range []string{"example.test", "EXAMPLE.test", "exämple", "@[`{"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		if got, want := lowerHost(name), strings.ToLower(name); got != want {
			t.Errorf("lowerHost(%q) = %q, want %q", name, got, want)
		}
	})
}
