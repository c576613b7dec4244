package limit

import (
	"fmt"
	"math"
	"time"
)

// errNoToken refuses a waiting call whose token, at the rate set by
// SetRate, comes after its deadline (less the destination's fastest
// answer).
var errNoToken = fmt.Errorf("%w: no token at the rate in force before the deadline", ErrLimited)

// The rate gate is a token bucket kept as GCRA (the generic cell rate
// algorithm): rtat is the theoretical arrival time of the next token (ns
// since base), riv the time per token (0: no gate), rtau the tolerance,
// (burst−1)·riv. A call takes a token when rtat ≤ now+rtau, moving rtat
// to max(rtat, now)+riv: one compare-and-swap, no lock.
const (
	maxRateInterval = int64(100 * 365 * 24 * time.Hour) // a token a century: the slowest rate
	maxRateTau      = int64(24 * time.Hour)             // the largest burst's tolerance
)

// takeToken takes a token at now if one is due, with interval iv (> 0).
// For a waiting call (wait), the token of nominal time t is due a drawn
// delay later (tokenDelay: in [0, iv)), and the next one's nominal time
// stays t + iv when it is taken within that delay: the delays do not add
// up, and the rate is kept.
func (l *Limiter) takeToken(now time.Duration, iv int64, wait bool) bool {
	n := int64(now)
	for {
		t := l.rtat.Load()
		due := t
		if wait {
			due += l.tokenDelay(t, iv)
		}
		if due > n+l.rtau.Load() {
			return false
		}
		next := max(t, n) + iv
		if wait && n < t+iv {
			next = t + iv
		}
		if l.rtat.CompareAndSwap(t, next) {
			return true
		}
	}
}

// tokenDelay returns how long after its nominal time t (ns since New) a
// token goes to a waiting call, for a gate of interval iv: a fraction of
// iv drawn from t and the gate's making (seed) by a 64-bit mix
// (splitmix64's finalizer), uniform over [0, iv). A gate whose calls wait
// for their tokens is a clock: gates set to about the same rate at about
// the same time (a fleet's processes, each released at the close of the
// fleet's breaker with its share of the rate) keep sending in step, each
// at its tokens, and the host sees their sum in waves (live, 1,000
// processes with a token every 2 s or so each, a mean of about 400 calls
// a second: 600-750 a second at the top of each wave, 130-210 at its
// bottom, and the host shed the top of every wave; docs/metastability.md).
// With each token at a drawn point of its interval, the sum of gates in
// step is spread over the interval at once. The draw is a function of the
// token's time and of the gate's making, not of shared state: the same
// schedule gives the same delays (a fake clock's tests are reproducible),
// and gates made at different times draw apart.
func (l *Limiter) tokenDelay(t, iv int64) int64 {
	z := uint64(t) + l.seed + 0x9e3779b97f4a7c15
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	z ^= z >> 31
	u := float64(z>>11) / (1 << 53) // in [0, 1)
	return min(int64(u*float64(iv)), iv-1)
}

// giveToken gives back a token taken by a call that then found no slot.
func (l *Limiter) giveToken(iv int64) { l.rtat.Add(-iv) }

// nextToken returns when the next token is due for a waiting call (never
// before now).
func (l *Limiter) nextToken(now time.Duration) time.Duration {
	t := l.rtat.Load()
	iv := l.riv.Load()
	due := t - l.rtau.Load()
	if iv > 0 {
		due += l.tokenDelay(t, iv)
	}
	return max(now, time.Duration(due))
}

// SetRate gates the starts of attempts by a token bucket of perSecond
// tokens per second holding up to burst tokens, and at most a day's worth
// of them at that rate (a fleet's share of a
// fleet-wide rate, see package fleet), on top of the limit of attempts in
// flight: Acquire then needs a token as well as a slot. A token is taken
// without a lock when one is due; a call that finds none waits, as over
// the limit (earliest deadline first, within its deadline, no goroutine
// per waiter; one timer per Limiter wakes the front waiter when its
// token is due), and fails fast with [ErrLimited] ("no token") when its
// turn comes after its deadline less the destination's fastest answer.
// The tokens' times are a token's time (1/perSecond) apart; a waiting
// call gets its token at a drawn point of the token's time that follows
// (drawn from the token's time and the gate's making, not from shared
// state: the same schedule gives the same draws), so that gates that
// wait at about the same rate from about the same moment (a fleet's
// processes after an outage) do not send together, one token's time
// apart, for as long as their calls wait; the draws do not add up, and
// the rate is kept. A call's turn is when its token will come: the next
// token's time plus one token's time per call waiting ahead of it, plus
// that token's draw (known in advance). A call that finds a token due
// takes it at once. A gate that was idle lets burst calls go at once;
// burst in (0, 1) is a phase instead: no call goes at once, the next
// token (the first, on an idle gate) comes (1 − burst)/perSecond from
// now at the earliest (a fleet spreads its processes' first calls after
// an outage over a token's time);
// burst <= 0 or NaN means 1. A perSecond below one token a century
// (about 3.2e-10) counts as one a century. perSecond <= 0 or +Inf turns the gate off
// (the default); NaN leaves the gate as it is. A new rate keeps the
// bucket's debt in tokens (a waiter's token comes when the debt is paid
// at the new rate); a lowered one fails the waiters whose turn then
// comes too late, a raised one (or off) grants at once the waiters whose
// tokens are then due.
//
// SetRate also returns what a fleet's sync reads: the attempts in flight
// and the calls waiting now; the calls refused ("no token", on arrival
// or while waiting; a call with a done context, which asked only for a
// free slot and token, is not counted) since the previous SetRate call,
// demand the rate in force did not serve; and the sum, the fastest (0: none) and the number
// of latency samples (sampled attempts released not dropped, the
// limiter's own sample of about one in 16 calls, or of 32 to 64 per round
// trip when loaded) taken since the previous SetRate call: the fastest
// tells a queue that stood the whole time (every sample waited) from a
// few slow samples. It takes the Limiter's lock and is safe for
// concurrent use.
func (l *Limiter) SetRate(perSecond, burst float64) (inFlight, waiting, refused int, latency, fastest time.Duration, samples int) {
	var iv, tau int64
	var phase float64 // burst in (0, 1): the next token's delay, in tokens
	if perSecond > 0 && !math.IsInf(perSecond, 1) {
		iv = int64(math.Min(float64(time.Second)/perSecond, float64(maxRateInterval)))
		iv = max(iv, 1)
		if burst > 0 && burst < 1 {
			phase = 1 - burst
		}
		if !(burst >= 1) {
			burst = 1
		}
		tau = int64(math.Min((burst-1)*float64(iv), float64(maxRateTau)))
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if iv > 0 && phase > 0 && !math.IsNaN(perSecond) {
		// Apply the rate first, then push the next token out.
		l.setRateLocked(iv, tau)
		now := int64(l.since())
		floor := now + int64(phase*float64(iv))
		for t := l.rtat.Load(); t < floor && !l.rtat.CompareAndSwap(t, floor); t = l.rtat.Load() {
		}
	} else if !math.IsNaN(perSecond) {
		l.setRateLocked(iv, tau)
	}
	inFlight, waiting, refused = int(uint32(l.state.Load())), l.waiters.Len()+l.open.Len(), l.repNoTok
	latency, fastest, samples = l.repSum, l.repMin, int(l.repN)
	l.repSum, l.repMin, l.repN, l.repNoTok = 0, 0, 0, 0
	return inFlight, waiting, refused, latency, fastest, samples
}

// setRateLocked sets the gate's interval and tolerance (iv 0: off),
// keeping the bucket's debt in tokens. Calls with mu held.
func (l *Limiter) setRateLocked(iv, tau int64) {
	if iv != l.riv.Load() || tau != l.rtau.Load() {
		now := l.since()
		if old := l.riv.Load(); old > 0 && iv > 0 {
			// Keep the debt, in tokens, at the new rate.
			for {
				t := l.rtat.Load()
				debt := float64(t-int64(now)) / float64(old)
				nt := int64(now) + int64(math.Min(debt*float64(iv), float64(tau+iv)))
				if debt <= 0 {
					nt = t
				}
				if l.rtat.CompareAndSwap(t, nt) {
					break
				}
			}
		} else if iv > 0 {
			l.rtat.Store(int64(now) - tau) // a new gate holds burst tokens
		}
		l.rtau.Store(tau)
		l.riv.Store(iv)
		l.gated.Store(l.throttle != nil || iv > 0)
		l.expireRateLocked(now)
		l.grantLocked()
	}
}

// armLocked makes the rate timer fire at at (or sooner, if it is armed
// to). Calls with mu held.
func (l *Limiter) armLocked(now, at time.Duration) {
	if l.rarmed != 0 && l.rarmed <= at {
		return
	}
	l.rarmed = at
	d := max(at-now, 1)
	if l.rtimer == nil {
		l.rtimer = time.AfterFunc(d, l.tick)
		return
	}
	l.rtimer.Reset(d)
}

// tick is the rate timer: a token is due for the front waiter.
func (l *Limiter) tick() {
	l.mu.Lock()
	l.rarmed = 0
	l.expireRateLocked(l.since())
	l.grantLocked()
	l.mu.Unlock()
}

// rateTurnLocked reports whether a call with ahead waiters ahead of it
// gets its token, at the rate in force, before deadline less the
// fastest answer (always, with no gate). The tokens in the bucket count:
// the k-th token from now (0 the next) has its time at rtat + k·iv, or,
// on a gate idle for a token's time or more (its next token taken at once,
// takeToken's rule), at now + k·iv, and is due tau earlier, plus its drawn
// delay (tokenDelay), and at once if that has passed. Calls with mu held.
func (l *Limiter) rateTurnLocked(now, deadline time.Duration, ahead int) bool {
	iv := l.riv.Load()
	if iv == 0 {
		return true
	}
	t, n, tau := l.rtat.Load(), int64(now), l.rtau.Load()
	from := t // the time of the token ahead of them all
	switch {
	case t > n-iv:
	case ahead == 0:
		return float64(n)+float64(l.learn.base.value) < float64(deadline) // due now, whatever its delay
	default:
		from = n
	}
	var due float64
	if k := int64(ahead); k < (1<<62-max(from, 0))/iv {
		at := from + k*iv // exact, as takeToken will draw it
		due = float64(at-tau) + float64(l.tokenDelay(at, iv))
	} else { // beyond 2^62 ns (146 years) no deadline is near
		due = float64(from) + float64(ahead)*float64(iv)
	}
	turn := math.Max(float64(now), due) + float64(l.learn.base.value)
	return turn < float64(deadline)
}

// expireRateLocked fails the first waiters (up to maxWalk) whose token,
// at the rate in force, comes after their deadline less the fastest
// answer. Calls with mu held.
func (l *Limiter) expireRateLocked(now time.Duration) {
	if l.riv.Load() == 0 {
		return
	}
	i := 0
	for w := l.waiters.Front(); w != nil && i < maxWalk; {
		next := w.Next()
		if !l.rateTurnLocked(now, w.Deadline(), i) {
			w.Value.noToken = true
			l.repNoTok++
			l.failLocked(w)
		} else {
			i++
		}
		w = next
	}
}
