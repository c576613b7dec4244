package httpretry

import (
	"strconv"
	"testing"

	"github.com/stormguard/stormguard/internal/guards"
)

func TestParseCapacity(t *testing.T) {
	tests := []struct {
		in     []string
		n      int
		wantOK bool
	}{
		{nil, 0, false},
		{[]string{"40"}, 40, true},
		{[]string{" \t40\t "}, 40, true},
		{[]string{"1"}, 1, true},
		{[]string{"0"}, 1, true}, // a server that answers runs something
		{[]string{"000"}, 1, true},
		{[]string{"1073741824"}, guards.MaxHint, true},
		{[]string{"99999999999999999999999999999"}, guards.MaxHint, true}, // saturates
		{[]string{""}, 0, false},
		{[]string{"  "}, 0, false},
		{[]string{"-1"}, 0, false},
		{[]string{"+4"}, 0, false},
		{[]string{"4.5"}, 0, false},
		{[]string{"4 5"}, 0, false},
		{[]string{"0x10"}, 0, false},
		{[]string{"40", "50"}, 0, false}, // several: not one server's word
		{[]string{"٤"}, 0, false},        // a non-ASCII digit
	}
	for _, tt := range tests {
		n, ok := parseCapacity(tt.in)
		if n != tt.n || ok != tt.wantOK {
			t.Errorf("parseCapacity(%q) = %d, %v; want %d, %v", tt.in, n, ok, tt.n, tt.wantOK)
		}
	}
	if a := testing.AllocsPerRun(100, func() { parseCapacity([]string{" 40 "}) }); a != 0 {
		t.Errorf("parseCapacity allocates %v times, want 0", a)
	}
}

// FuzzParseCapacity: any value parses without a panic to no hint or a hint
// in 1 to guards.MaxHint, and a plain decimal number below the bound reads
// back as itself.
func FuzzParseCapacity(f *testing.F) {
	for _, s := range []string{"40", " 7 ", "0", "", "-1", "18446744073709551616", "1e3", "\t"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		n, ok := parseCapacity([]string{v})
		if !ok {
			if n != 0 {
				t.Fatalf("parseCapacity(%q) = %d, false; want 0 with no hint", v, n)
			}
			return
		}
		if n < 1 || n > guards.MaxHint {
			t.Fatalf("parseCapacity(%q) = %d, outside 1 to %d", v, n, guards.MaxHint)
		}
		if x, err := strconv.Atoi(v); err == nil && x >= 1 && x < guards.MaxHint && v[0] != '+' && v[0] != '-' && n != x {
			t.Fatalf("parseCapacity(%q) = %d, want %d", v, n, x)
		}
	})
}
