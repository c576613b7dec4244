package budget

import (
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stormguard/stormguard/internal/clock"
	"github.com/stormguard/stormguard/internal/tagged"
	"github.com/stormguard/stormguard/internal/timed"
)

// Defaults of a [Config]'s zero fields, documented there.
const (
	defaultRatio        = 0.1
	defaultMinPerSecond = 1.0
	defaultWindow       = 10 * time.Second
	defaultSlices       = 10
)

// Limits on a [Config], checked by [New] and documented there.
const (
	// maxSlices bounds Slices: Withdraw reads every slice, so its cost
	// grows with Slices.
	maxSlices = 3600
	// minSlice is the shortest slice, Window/Slices. Counter words hold
	// slice numbers in 40 bits and compare them correctly while they are
	// less than 2^39 slices apart: 17 years of 1 ms slices, 17,000 years
	// of the default 1 s slices.
	minSlice = time.Millisecond
	// maxCount is the count at which a slice's requests or retries
	// saturate (16,777,215).
	maxCount = tagged.MaxCount
)

// Config is the plain-data description of a budget. Build a [Budget] from it
// with [New]. Zero fields take the defaults, so Config{} allows retries up
// to 10% of the requests plus 1 per second, over a 10 s window in 10
// slices.
type Config struct {
	// Ratio is the number of retries allowed per request deposited in the
	// window, in [0, 1]; 0 means 0.1 (the SRE book's 10%). A negative
	// Ratio means none: only the floor is left.
	Ratio float64
	// MinPerSecond is the floor: retries per second allowed on top of
	// Ratio, so MinPerSecond·Window.Seconds() retries per window (of
	// whole slices; a span of one Window across slices may hold twice as
	// many: see the package documentation) are always allowed, even to a
	// client that sends nothing. 0 means 1 per
	// second (10 per default window); a negative value means no floor. It
	// must be finite.
	MinPerSecond float64
	// Window is the length of the sliding window; 0 means 10 s. It must be
	// a multiple of Slices nanoseconds, with Window/Slices at least 1 ms.
	Window time.Duration
	// Slices is the number of slices the window is cut into, from 1 to
	// 3600; 0 means 10 (1 s each by default). More slices make the window
	// slide more smoothly and Withdraw slower: it reads every slice.
	Slices int
	// Now returns the current time for [Budget.Deposit], [Budget.Withdraw]
	// and [Budget.Stats]; nil means the monotonic clock (time.Now's
	// reading when New ran, advanced by time.Since: cheaper than time.Now
	// and immune to wall-clock steps). It is called from every goroutine
	// that uses the budget, so it must be safe for concurrent use. Tests
	// pass a fake clock here, or run in a testing/synctest bubble.
	Now func() time.Time
}

// errInvalidConfig is wrapped by every error [New] returns: New fails for
// no other reason.
var errInvalidConfig = errors.New("budget: invalid config")

// The retry loop's view of a budget.
var _ interface {
	Deposit()
	Withdraw() bool
} = (*Budget)(nil)

// Budget is a per-client retry budget. Build one with [New]. The zero value
// is a budget with the default settings whose window starts at its first
// use. A Budget is safe for concurrent use by any number of goroutines, and
// its methods take no lock and allocate nothing. It must not be copied
// after first use.
type Budget struct {
	once sync.Once // sets up a zero Budget with the defaults

	// Immutable after New.
	cfg     Config
	ratio   float64
	reserve float64 // MinPerSecond·Window.Seconds()
	slice   time.Duration
	slices  int64
	now     func() time.Time
	base    time.Time // start of slice 0

	// head is the newest slice in which a retry was admitted, and the retries
	// admitted in it. Every admission is a compare-and-swap on head.
	_    [64]byte // keep head off the cache line of the fields above
	head atomic.Uint64
	_    [56]byte

	// requests[i] counts deposits of the slice s with s mod Slices = i.
	requests []atomic.Uint64
	// retries[i] holds the final retry count of an older slice s with
	// s mod Slices = i, published before head moves past s.
	retries []atomic.Uint64
}

// New validates c and returns a Budget whose slice 0 begins now (c.Now()).
// Zero fields take the defaults (see [Config]). It returns an error, its text
// starting "budget: invalid config: ", if and only if Ratio is NaN or above 1, MinPerSecond is NaN or
// infinite, Window is negative, Slices is outside [0, 3600], or Window is
// not a multiple of Slices nanoseconds of at least 1 ms each. A Budget
// that was built never fails or panics later.
func New(c Config) (*Budget, error) {
	b := new(Budget)
	var err error
	b.once.Do(func() { err = b.init(c) })
	if err != nil {
		return nil, err
	}
	return b, nil
}

// init validates c and sets b up; it runs once per Budget.
func (b *Budget) init(c Config) error {
	if c.Ratio == 0 {
		c.Ratio = defaultRatio
	}
	if c.MinPerSecond == 0 {
		c.MinPerSecond = defaultMinPerSecond
	}
	if c.Window == 0 {
		c.Window = defaultWindow
	}
	if c.Slices == 0 {
		c.Slices = defaultSlices
	}
	ratio, floor := max(c.Ratio, 0), max(c.MinPerSecond, 0)
	switch {
	case !(c.Ratio <= 1):
		return fmt.Errorf("%w: Ratio %v must be at most 1", errInvalidConfig, c.Ratio)
	case math.IsNaN(c.MinPerSecond) || math.IsInf(c.MinPerSecond, 0):
		return fmt.Errorf("%w: MinPerSecond %v must be finite", errInvalidConfig, c.MinPerSecond)
	case c.Window < 0:
		return fmt.Errorf("%w: Window %v must be positive", errInvalidConfig, c.Window)
	case c.Slices < 1 || c.Slices > maxSlices:
		return fmt.Errorf("%w: Slices %d must be in [0, %d]", errInvalidConfig, c.Slices, maxSlices)
	case c.Window%time.Duration(c.Slices) != 0:
		return fmt.Errorf("%w: Window %v is not a multiple of Slices (%d)", errInvalidConfig, c.Window, c.Slices)
	case c.Window/time.Duration(c.Slices) < minSlice:
		return fmt.Errorf("%w: a slice of %v (Window %v / Slices %d) is shorter than %v",
			errInvalidConfig, c.Window/time.Duration(c.Slices), c.Window, c.Slices, minSlice)
	}
	now := c.Now
	if now == nil {
		now = clock.Monotonic()
	}
	b.cfg = c
	b.ratio = ratio
	b.reserve = floor * c.Window.Seconds()
	b.slice = c.Window / time.Duration(c.Slices)
	b.slices = int64(c.Slices)
	b.now = now
	b.base = now()
	b.requests = make([]atomic.Uint64, c.Slices)
	b.retries = make([]atomic.Uint64, c.Slices)
	empty := tagged.Pack(tagged.Never, 0)
	b.head.Store(empty)
	for i := range b.requests {
		b.requests[i].Store(empty)
		b.retries[i].Store(empty)
	}
	return nil
}

// ready sets up a zero Budget with the defaults on its first use.
func (b *Budget) ready() {
	b.once.Do(func() { _ = b.init(Config{}) })
}

// Config returns the configuration b was built from, with the defaults
// filled in (Now as given, possibly nil).
func (b *Budget) Config() Config {
	b.ready()
	return b.cfg
}

// sliceOf returns the number of the slice holding t: 0 for the slice that
// began when New ran, negative before it.
func (b *Budget) sliceOf(t time.Time) int64 {
	d := t.Sub(b.base) // saturates instead of overflowing
	s := int64(d / b.slice)
	if d < 0 && d%b.slice != 0 {
		s-- // floor, not truncation
	}
	return s
}

// index returns the ring position of slice s.
func (b *Budget) index(s int64) int64 {
	i := s % b.slices
	if i < 0 {
		i += b.slices
	}
	return i
}

// Deposit records an original request (not a retry), at the time the
// budget's clock reads. A deposit whose slice has already been reused by a
// later one (the clock went back a whole window) lies outside every window
// still to come and is dropped. Deposit is safe for concurrent use, takes
// no lock and allocates nothing.
func (b *Budget) Deposit() {
	b.ready()
	b.deposit(b.now(), 1)
}

// DepositN records n original requests at once, like n calls of
// [Budget.Deposit] in one counter update: for counts gathered elsewhere (a
// fleet's sync feeding the local budget it falls back to). n of 0 or less
// records nothing; a slice's count saturates at 16,777,215.
func (b *Budget) DepositN(n int) {
	b.ready()
	if n <= 0 {
		return
	}
	b.deposit(b.now(), uint64(min(n, maxCount)))
}

// depositAt records one original request at time t, a reading of
// time.Now: the retry loop of this module hands it the reading it made for
// the call's deadline (see internal/timed). On a budget with a Config.Now
// of the caller's that reading is not on the budget's clock, and the
// budget reads its own. It is a use: a zero Budget's window starts here.
func (b *Budget) depositAt(t time.Time) {
	b.ready()
	if b.cfg.Now != nil {
		t = b.now()
	}
	b.deposit(t, 1)
}

func init() { timed.Deposit = (*Budget).depositAt }

// deposit adds n deposits at t, saturating at maxCount.
func (b *Budget) deposit(t time.Time, add uint64) {
	s := b.sliceOf(t)
	tag := tagged.Tag(s)
	w := &b.requests[b.index(s)]
	for {
		old := w.Load()
		otag, n := tagged.Unpack(old)
		var next uint64
		switch d := tagged.Diff(tag, otag); {
		case d == 0:
			if n == tagged.MaxCount {
				return // saturated
			}
			next = old + min(add, tagged.MaxCount-n)
		case d > 0:
			next = tagged.Pack(s, add) // the word held an expired slice: reset it
		default:
			return // the word already holds a later slice: t has expired
		}
		if w.CompareAndSwap(old, next) {
			return
		}
	}
}

// Withdraw reports whether a retry may be sent now (at the time the
// budget's clock reads), and if so records it: it admits the retry if and
// only if, in the window ending in the current slice, retries + 1 <=
// Ratio·requests + MinPerSecond·Window.Seconds() (see the package
// documentation). If the clock reads a time older than the newest slice in
// which a retry was admitted, the retry counts as that slice's.
//
// Withdraw is safe for concurrent use, takes no lock and allocates
// nothing: the admission is one compare-and-swap, retried if another
// withdrawal won the race, so concurrent withdrawals never admit more than
// the rule allows. It reads every slice, so it costs O(Slices).
func (b *Budget) Withdraw() bool {
	b.ready()
	return b.withdraw(b.now())
}

func (b *Budget) withdraw(t time.Time) bool {
	s := b.sliceOf(t)
	for {
		h := b.head.Load()
		htag, hn := tagged.Unpack(h)
		d := tagged.Diff(tagged.Tag(s), htag)
		hs := s - d // the head slice
		cur := max(s, hs)
		if float64(b.retriesIn(cur, hs, hn)+1) > allowance(b.ratio*float64(b.requestsIn(cur))+b.reserve) {
			return false
		}
		var next uint64
		if d <= 0 {
			if hn == tagged.MaxCount {
				return false // saturated: refuse rather than miscount
			}
			next = h + 1
		} else {
			// Moving the head forward: publish the old head's count first,
			// so that whoever sees the new head also sees it.
			b.publish(hs, hn)
			next = tagged.Pack(cur, 1)
		}
		if b.head.CompareAndSwap(h, next) {
			return true
		}
	}
}

// publish records that slice s had at least n retries, in its ring word.
// Counts of a slice only grow, so a late publish of an older count never
// lowers the word; a word holding a later slice is left alone.
func (b *Budget) publish(s int64, n uint64) {
	tag := tagged.Tag(s)
	w := &b.retries[b.index(s)]
	for {
		old := w.Load()
		otag, on := tagged.Unpack(old)
		d := tagged.Diff(tag, otag)
		if d < 0 || (d == 0 && on >= n) {
			return
		}
		if w.CompareAndSwap(old, tagged.Pack(s, n)) {
			return
		}
	}
}

// retriesIn returns the retries admitted in the window ending in slice cur,
// given that the head is slice hs with count hn (hs <= cur). The head's own
// ring word may hold a partial count (or none yet), so its count comes from
// the head; slices between hs and cur have none.
func (b *Budget) retriesIn(cur, hs int64, hn uint64) uint64 {
	var sum uint64
	s := cur - b.slices + 1
	for i := b.index(s); s <= hs; s++ {
		if s == hs {
			sum += hn
			break
		}
		if tag, n := tagged.Unpack(b.retries[i].Load()); tag == tagged.Tag(s) {
			sum += n
		}
		if i++; i == b.slices {
			i = 0
		}
	}
	return sum
}

// requestsIn returns the deposits in the window ending in slice cur.
func (b *Budget) requestsIn(cur int64) uint64 {
	var sum uint64
	s := cur - b.slices + 1
	for i := b.index(s); s <= cur; s++ {
		if tag, n := tagged.Unpack(b.requests[i].Load()); tag == tagged.Tag(s) {
			sum += n
		}
		if i++; i == b.slices {
			i = 0
		}
	}
	return sum
}

// Stats is a snapshot of a budget's window.
type Stats struct {
	// Requests is the number of deposits in the window.
	Requests int
	// Retries is the number of retries admitted in the window.
	Retries int
	// Limit is Ratio·Requests + MinPerSecond·Window.Seconds(): the window
	// admits retries while Retries+1 <= Limit·(1+10⁻¹²) (the relative
	// allowance for floating-point rounding of the package documentation:
	// a Limit of 28.999999999999996 from 0.29·100 admits 29), so
	// ⌊Limit·(1+10⁻¹²)⌋ − Retries more are available if nothing else
	// happens.
	Limit float64
}

// Stats returns a snapshot of the window that a withdrawal now would see,
// without recording anything. Under concurrent use the counters are read
// one after another, not as one atomic snapshot. It allocates nothing.
func (b *Budget) Stats() Stats {
	b.ready()
	s := b.sliceOf(b.now())
	htag, hn := tagged.Unpack(b.head.Load())
	hs := s - tagged.Diff(tagged.Tag(s), htag)
	cur := max(s, hs)
	req := b.requestsIn(cur)
	return Stats{
		Requests: int(req),
		Retries:  int(b.retriesIn(cur, hs, hn)),
		Limit:    b.ratio*float64(req) + b.reserve,
	}
}

// allowance is the limit of a window as Withdraw compares with it: limit,
// its floating-point rounding allowed for (0.29·100 is 28.999999999999996,
// and 29 retries of 100 requests are within 0.29).
func allowance(limit float64) float64 { return limit * (1 + 1e-12) }
