package httpretry

import "testing"

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
