// Black-box tests of the package against its documentation, from attacks
// on it from outside: each names the sentence it checks.

package wire_test

import (
	"math"
	"math/big"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stormguard/stormguard/wire"
)

// atkRefAttempt is the documented grammar, written independently.
func atkRefAttempt(s string) (int, bool) {
	if i := strings.Index(s, ","); i >= 0 {
		s = s[:i]
	}
	s = strings.TrimLeft(s, " \t")
	s = strings.TrimRight(s, " \t")
	if s == "" {
		return 0, false
	}
	for _, r := range s {
		if r < '0' || r > '9' {
			return 0, false
		}
	}
	v, _ := new(big.Int).SetString(s, 10)
	if v.Sign() <= 0 || v.Cmp(big.NewInt(1048576)) > 0 {
		return 0, false
	}
	return int(v.Int64()), true
}

func FuzzAttackParseAttemptRef(f *testing.F) {
	for _, s := range []string{"1", " 2 ", "3,4", "0", "-1", "1048576", "1048577", "0001048576", "99999999999999999999", "", "x", "\t7\t,", "\v1", "1\n", "\u00a01"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, ok := wire.ParseAttempt(s)
		rn, rok := atkRefAttempt(s)
		if n != rn || ok != rok {
			t.Fatalf("ParseAttempt(%q) = %d,%v; grammar says %d,%v", s, n, ok, rn, rok)
		}
	})
}

func TestAttackParseAttemptEdges(t *testing.T) {
	for _, s := range []string{"1048576", strings.Repeat("0", 100000) + "5", strings.Repeat("9", 100000), "1" + strings.Repeat("0", 7), "\v2", "2\r", "2\n", " , 2", "2 ,", "\t\t3\t\t,x"} {
		n, ok := wire.ParseAttempt(s)
		rn, rok := atkRefAttempt(s)
		if n != rn || ok != rok {
			t.Errorf("ParseAttempt(%.30q) = %d,%v; grammar says %d,%v", s, n, ok, rn, rok)
		}
	}
	if a := testing.AllocsPerRun(100, func() { wire.ParseAttempt(" 12, 3") }); a != 0 {
		t.Errorf("allocs %v", a)
	}
}

var atkReasons = []string{"not-retryable", "attempts-exhausted", "deadline", "canceled", "budget-exhausted", "circuit-open", "limited"}

func atkRefGiveUp(s string) (wire.GiveUp, bool) {
	parts := strings.Split(s, ";")
	tok := strings.Trim(parts[0], " \t")
	var g wire.GiveUp
	for _, r := range atkReasons {
		if strings.EqualFold(tok, r) {
			g.Reason = r
		}
	}
	if g.Reason == "" {
		return wire.GiveUp{}, false
	}
	for _, p := range parts[1:] {
		p = strings.Trim(p, " \t")
		k, v, found := strings.Cut(p, "=")
		if !found {
			continue
		}
		switch strings.ToLower(k) {
		case "attempts":
			if n, ok := atkRefAttempt(v); ok {
				g.Attempts = n
			}
		case "retry-after":
			v = strings.Trim(v, " \t")
			if v == "" {
				continue
			}
			digits := true
			for _, r := range v {
				if r < '0' || r > '9' {
					digits = false
				}
			}
			if !digits {
				continue
			}
			b, _ := new(big.Int).SetString(v, 10)
			b.Mul(b, big.NewInt(int64(time.Second)))
			if b.IsInt64() {
				g.RetryAfter = time.Duration(b.Int64())
			} else {
				g.RetryAfter = math.MaxInt64
			}
		}
	}
	return g, true
}

func FuzzAttackParseGiveUpRef(f *testing.F) {
	for _, s := range []string{"attempts-exhausted;attempts=3", "CIRCUIT-OPEN;Retry-After=9223372036", "circuit-open;retry-after=9223372037", "deadline;attempts=", ";;;", "limited ; retry-after=5", "", "circuit-open;retry-after=+5", "circuit-open;retry-after=0x5", "circuit-open;retry-after=1_0", "canceled;attempts=2,3"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		g, ok := wire.ParseGiveUp(s)
		rg, rok := atkRefGiveUp(s)
		if g != rg || ok != rok {
			t.Fatalf("ParseGiveUp(%q) = %+v,%v; doc grammar says %+v,%v", s, g, ok, rg, rok)
		}
	})
}

func TestAttackParseGiveUpEdges(t *testing.T) {
	for _, s := range []string{
		"circuit-open;retry-after=9223372036", "circuit-open;retry-after=9223372037",
		"circuit-open;retry-after=18446744073709551615", "circuit-open;retry-after=18446744073709551616",
		"circuit-open;retry-after=+5", "circuit-open;retry-after=1_0", "circuit-open;retry-after=0x10",
		"circuit-open;retry-after=" + strings.Repeat("9", 5000), "Limited", "limited;ATTEMPTS=4",
		"limited;attempts=2;attempts=5", "limited;retry-after=3;retry-after=x", "limited;=;=5;attempts",
		"circuit-open\t;\tattempts=2\t", "\u212aircuit-open", "circuit-open;retry-after=\u0661",
		"circuıt-open", "not-retryable;attempts=1048577", "deadline;attempts=0",
	} {
		g, ok := wire.ParseGiveUp(s)
		rg, rok := atkRefGiveUp(s)
		if g != rg || ok != rok {
			t.Errorf("ParseGiveUp(%.60q) = %+v,%v; doc grammar says %+v,%v", s, g, ok, rg, rok)
		}
	}
}

func atkRefDontRetry(h http.Header) bool {
	for _, v := range h["Stormguard-Retry"] {
		if strings.ToLower(strings.Trim(v, " \t")) == "no" {
			return true
		}
	}
	return false
}

func FuzzAttackDontRetryRef(f *testing.F) {
	for _, s := range []string{"no", " NO\t", "nO", "no,no", "n\u0130", "\u212ao"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		h := http.Header{"Stormguard-Retry": {s}}
		if got, want := wire.DontRetry(h), atkRefDontRetry(h); got != want {
			t.Fatalf("DontRetry(%q) = %v, want %v", s, got, want)
		}
	})
}

func TestAttackDontRetryViaHeaderAPI(t *testing.T) {
	h := http.Header{}
	h.Set("stormguard-retry", "No")
	if !wire.DontRetry(h) {
		t.Errorf("Set with lower-case name then DontRetry = false")
	}
	h = http.Header{}
	h.Add("Stormguard-Retry", "maybe")
	h.Add("Stormguard-Retry", " no ")
	if !wire.DontRetry(h) {
		t.Errorf("second line no not seen")
	}
	h = http.Header{}
	wire.SetDontRetry(h)
	h2 := http.Header{}
	wire.SetDontRetry(h2)
	h.Get("Stormguard-Retry")
	h["Stormguard-Retry"][0] = "x"
	if h2.Get("Stormguard-Retry") != "no" {
		t.Errorf("shared slice")
	}
	// SetDontRetry replaces existing values
	h = http.Header{"Stormguard-Retry": {"later", "x"}}
	wire.SetDontRetry(h)
	if v := h.Values("Stormguard-Retry"); len(v) != 1 || v[0] != "no" {
		t.Errorf("SetDontRetry left %q", v)
	}
}
