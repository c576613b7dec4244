// Package backoff computes how long to wait before a retry: capped exponential
// backoff with jitter, or a constant or linear schedule.
//
// For retry n (n = 1 is the first retry, not the first attempt), base b and
// cap c, let exp(n) = min(c, b·2^n). The strategies are
//
//	NoJitter      exp(n)
//	FullJitter    U[0,1) · exp(n)                         (the default)
//	EqualJitter   exp(n)/2 + U[0,1) · exp(n)/2
//	Decorrelated  min(c, b + U[0,1) · (prev·3 − b))       prev starts at b
//	Constant      b
//	Linear        min(c, b·n)
//
// where prev is the previous computed delay. Constant and Linear, the
// fixed schedules users of other libraries reach for first, have no jitter:
// clients that failed together retry together, so pair them with a retry
// budget, or prefer a jittered strategy. A cap is always in force: no
// strategy ever returns more than c, whatever n is.
//
// A [Config] is plain data whose zero fields take the defaults (full jitter,
// base 100 ms, cap 10 s); [New] validates it once and returns a [Backoff],
// which is immutable and safe for concurrent use as long as its random
// source is (the default one is). Per-call state, the retry number and, for
// Decorrelated, the previous delay, lives with the caller in a [Sequence]
// value, which costs no allocation.
package backoff

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"time"
)

// Strategy selects how a delay is randomised. The zero value is [FullJitter].
type Strategy uint8

const (
	// FullJitter sleeps a uniformly random time in [0, exp(n)). It spreads a
	// herd of clients the widest and is the default.
	FullJitter Strategy = iota
	// NoJitter sleeps exactly exp(n): every client that failed together
	// retries together. Provided for comparison, not for production.
	NoJitter
	// EqualJitter keeps half of exp(n) and randomises the other half, so the
	// delay is in [exp(n)/2, exp(n)).
	EqualJitter
	// Decorrelated grows from the previous delay instead of the retry number:
	// min(cap, base + U·(prev·3 − base)).
	Decorrelated
	// Constant sleeps exactly base before every retry (a Cap below it is
	// an error, as for every strategy). No jitter.
	Constant
	// Linear sleeps base·n before retry n, up to the cap: base, 2·base,
	// 3·base, ... No jitter.
	Linear

	numStrategies
)

var strategyNames = [numStrategies]string{
	FullJitter:   "full",
	NoJitter:     "none",
	EqualJitter:  "equal",
	Decorrelated: "decorrelated",
	Constant:     "constant",
	Linear:       "linear",
}

// String returns the strategy's short name ("none", "full", "equal",
// "decorrelated", "constant", "linear"), or "Strategy(N)" for an unknown value.
func (s Strategy) String() string {
	if s < numStrategies {
		return strategyNames[s]
	}
	return fmt.Sprintf("Strategy(%d)", uint8(s))
}

// parseStrategy returns the strategy named s, as printed by
// [Strategy.String]. It is case-sensitive.
func parseStrategy(s string) (Strategy, error) {
	for i, name := range strategyNames {
		if name == s {
			return Strategy(i), nil
		}
	}
	return 0, fmt.Errorf("backoff: unknown strategy %q (want none, full, equal, decorrelated, constant or linear)", s)
}

// MarshalText implements [encoding.TextMarshaler]: the strategy's name, or
// an error for a value that is not one of the six strategies.
func (s Strategy) MarshalText() ([]byte, error) {
	if s >= numStrategies {
		return nil, fmt.Errorf("backoff: unknown strategy %d", uint8(s))
	}
	return []byte(s.String()), nil
}

// UnmarshalText implements [encoding.TextUnmarshaler], so a Strategy works
// with flag.TextVar and encoding/json: it accepts the six strategies'
// names as [Strategy.String] prints them, case-sensitively (not the
// "Strategy(N)" of an unknown value).
func (s *Strategy) UnmarshalText(b []byte) error {
	v, err := parseStrategy(string(b))
	if err != nil {
		return err
	}
	*s = v
	return nil
}

// Defaults of a [Config]'s zero fields.
const (
	defaultBase = 100 * time.Millisecond
	defaultCap  = 10 * time.Second
)

// Config is the plain-data description of a backoff. Build a [Backoff] from
// it with [New]. Zero fields take the defaults, so Config{} is full jitter,
// base 100 ms, cap 10 s and the runtime's random source.
type Config struct {
	// Strategy is the jitter strategy; the zero value is FullJitter.
	Strategy Strategy
	// Base is b in exp(n) = min(Cap, Base·2^n); 0 means 100 ms. A negative
	// Base is an error.
	Base time.Duration
	// Cap is the largest delay ever returned; 0 means 10 s, or Base if Base
	// is larger. A Cap below Base is an error.
	Cap time.Duration
	// Rand returns uniformly distributed numbers in [0, 1) (a result
	// outside is clamped into it). Nil means the Go runtime's generator
	// (math/rand/v2), which is safe for concurrent use, takes no lock and
	// cannot be seeded; pass a seeded generator's Float64 (such as
	// rand.New(rand.NewPCG(seed, 0)).Float64) for reproducible figures, or
	// func() float64 { return 0.5 } to pin the jitter in a test. A Backoff
	// is only as safe for concurrent use as its Rand.
	Rand func() float64
}

// errInvalidConfig is wrapped by every error [New] returns: New fails for
// no other reason.
var errInvalidConfig = errors.New("backoff: invalid config")

// Backoff computes retry delays. It is immutable once built; it is safe for
// concurrent use when its random source is (the default one is).
type Backoff struct {
	strategy Strategy
	base     time.Duration
	cap      time.Duration
	baseF    float64        // base in nanoseconds
	capF     float64        // cap in nanoseconds
	rand     func() float64 // nil: math/rand/v2
}

// New validates c and returns a Backoff. Zero fields take the defaults (see
// [Config]). It returns an error, its text starting "backoff: invalid config: ",
// if and only if Base is
// negative, Cap is below Base, or the strategy is unknown; a Backoff that
// was built never fails or panics later.
func New(c Config) (*Backoff, error) {
	if c.Base == 0 {
		c.Base = defaultBase
	}
	if c.Cap == 0 {
		c.Cap = max(defaultCap, c.Base)
	}
	switch {
	case c.Strategy >= numStrategies:
		return nil, fmt.Errorf("%w: unknown Strategy %d", errInvalidConfig, uint8(c.Strategy))
	case c.Base < 0:
		return nil, fmt.Errorf("%w: Base %v must be positive", errInvalidConfig, c.Base)
	case c.Cap < c.Base:
		return nil, fmt.Errorf("%w: Cap %v must be at least Base %v", errInvalidConfig, c.Cap, c.Base)
	}
	r := c.Rand
	return &Backoff{
		strategy: c.Strategy,
		base:     c.Base,
		cap:      c.Cap,
		baseF:    float64(c.Base),
		capF:     float64(c.Cap),
		rand:     r,
	}, nil
}

// u returns the next random number, in [0, 1).
func (b *Backoff) u() float64 {
	if b.rand == nil {
		return rand.Float64()
	}
	v := b.rand()
	switch {
	case !(v >= 0): // also NaN
		return 0
	case v >= 1:
		return 1 - 0x1p-53
	}
	return v
}

// exp returns exp(n) = min(cap, base·2^n), the delay before jitter, in
// nanoseconds as a float64. n below 1 counts as 1. It saturates at the cap
// for any n: no overflow, no negative.
func (b *Backoff) exp(n int) float64 {
	if n < 1 {
		n = 1
	}
	if n > 1100 { // 2^n is +Inf well before this; keep Ldexp's argument small.
		return b.capF
	}
	return math.Min(b.capF, math.Ldexp(b.baseF, n))
}

// expDuration returns exp(n) = min(cap, base·2^n) exactly (in integers:
// a float64 rounds a base above 2^53 ns, 104 days); n below 1 counts as 1.
// It saturates at the cap for any n.
func (b *Backoff) expDuration(n int) time.Duration {
	n = max(n, 1)
	if n >= 63 || b.base > b.cap>>n {
		return b.cap
	}
	return min(b.cap, b.base<<n)
}

// linearDuration returns min(cap, base·n), exactly (in integers: a
// float64 would round a base above 2^53 ns); n below 1 counts as 1. It
// saturates at the cap for any n.
func (b *Backoff) linearDuration(n int) time.Duration {
	n = max(n, 1)
	if b.base > 0 && int64(b.cap)/int64(b.base) < int64(n) {
		return b.cap
	}
	return min(b.cap, b.base*time.Duration(n))
}

// toDuration converts a non-negative float number of nanoseconds to a
// Duration, clamping into [0, cap].
func (b *Backoff) toDuration(ns float64) time.Duration {
	if !(ns > 0) {
		return 0
	}
	if ns >= b.capF {
		return b.cap
	}
	return min(time.Duration(ns), b.cap)
}

// delay returns the delay before retry n (n = 1 is the first retry; n below 1
// counts as 1). prev is the previous delay this call computed and matters only
// for Decorrelated, where a prev below base (such as 0 on the first retry)
// counts as base. The result is always in [0, cap], and for Decorrelated,
// Constant and Linear in [base, cap]. It allocates nothing.
func (b *Backoff) delay(n int, prev time.Duration) time.Duration {
	switch b.strategy {
	case NoJitter:
		return b.expDuration(n)
	case EqualJitter:
		// In integers, as NoJitter: at least exp(n)/2 (rounded up), below
		// exp(n) (a product that rounds up to the rest is held below it).
		e := b.expDuration(n)
		if e <= 1 {
			return 0
		}
		lo := e - e/2
		return min(lo+time.Duration(b.u()*float64(e-lo)), e-1)
	case Decorrelated:
		p := math.Max(float64(prev), b.baseF)
		// At least base: a float64 holds 53 bits, and a base above 2^53 ns
		// (104 days) would round below itself.
		return max(b.base, b.toDuration(math.Min(b.capF, b.baseF+b.u()*(p*3-b.baseF))))
	case Constant:
		return b.base
	case Linear:
		return b.linearDuration(n)
	default: // FullJitter
		return b.toDuration(b.u() * b.exp(n))
	}
}

// Jitter returns d plus a uniformly random part of spread, drawn from b's
// random source: a delay in [d, d+spread). A retry loop uses it to spread
// clients above a server's Retry-After instead of having them all return in
// the same instant. spread of 0 or less returns d; the sum saturates
// instead of overflowing.
func (b *Backoff) Jitter(d, spread time.Duration) time.Duration {
	if spread <= 0 {
		return d
	}
	j := time.Duration(b.u() * float64(spread))
	if d > math.MaxInt64-j {
		return math.MaxInt64
	}
	return d + j
}

// Sequence returns the delays of one call's retries in order. It is a value:
// keep it in a local variable (or a field of the call's state); it costs no
// allocation. Sequences of one Backoff may be used by many goroutines at
// once, each its own, when b's random source is safe for concurrent use.
func (b *Backoff) Sequence() Sequence {
	return Sequence{b: b}
}

// Sequence walks the delays of one call: the first [Sequence.Next] is the
// delay before retry 1, the next before retry 2, and so on, with
// Decorrelated fed the previous delay. A Sequence belongs to one call and is
// not safe for concurrent use; its zero value is not usable (get one from
// [Backoff.Sequence]).
type Sequence struct {
	b    *Backoff
	n    int
	prev time.Duration
}

// Next returns the delay before the next retry: always in [0, cap], and
// for Decorrelated, Constant and Linear in [base, cap].
func (s *Sequence) Next() time.Duration {
	s.n++
	d := s.b.delay(s.n, s.prev)
	s.prev = d
	return d
}
