package admission

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/stormguard/stormguard/observe"
)

// Default settings: a zero field of a [Config] takes the matching one.
const (
	// DefaultMaxInFlight is the default limit on requests in progress
	// (handlers running at once): Envoy's default for a cluster's
	// max_requests and max_pending_requests.
	DefaultMaxInFlight = 1024
	// DefaultMaxQueueWait is the longest a request waits in the queue for a
	// free slot. A queue absorbs bursts; under sustained overload a request
	// that waited half a second is better answered with a Retry-After that
	// spreads it out than kept waiting longer.
	DefaultMaxQueueWait = 500 * time.Millisecond
	// DefaultRetryRatio is the SRE book's 10%: retries admitted per original
	// request seen in the window.
	DefaultRetryRatio = 0.1
	// DefaultMinRetriesPerSecond is the floor of retries per second admitted
	// whatever the traffic: 10 per default window.
	DefaultMinRetriesPerSecond = 1.0
	// DefaultWindow is the length of the sliding window over which
	// originals and retries are counted.
	DefaultWindow = 10 * time.Second
	// DefaultSlices is the number of slices the window is cut into (1 s
	// each by default).
	DefaultSlices = 10
	// DefaultRetryAfterBase is the shortest Retry-After a refusal carries.
	DefaultRetryAfterBase = time.Second
	// DefaultRetryAfterSpread is the width of the range a refusal's
	// Retry-After is drawn from: with the default base, 1 s to 11 s, which
	// HTTP sends as one of the whole seconds 1 to 10.
	DefaultRetryAfterSpread = 10 * time.Second
)

// MaxRetryAfter is the largest RetryAfterBase + RetryAfterSpread a [Config]
// may ask for.
const MaxRetryAfter = 24 * time.Hour

// ErrInvalidConfig is wrapped by every error [New] returns.
var ErrInvalidConfig = errors.New("admission: invalid config")

// Config is the plain-data description of a [Controller]. Every zero field
// takes its default (the Default constants), so Config{} and
// Config{MaxInFlight: 100} are valid. Where a negative value is allowed it
// says so; otherwise a negative value is an error. A Config holds no state:
// one value may be shared and reused.
type Config struct {
	// MaxInFlight is the most requests admitted at once (work in
	// progress): a request that finds this many in progress waits in the
	// queue or is shed. 0 means [DefaultMaxInFlight]; a negative value
	// means no limit (only retries are controlled, nothing queues).
	MaxInFlight int
	// MaxQueue is the most requests that wait for a free slot at once; a
	// request that finds the queue full is shed at once. 0 means the same
	// as the MaxInFlight in force (a queue as deep as the work in
	// progress); a negative value means no queue: shed as soon as
	// MaxInFlight are in progress.
	MaxQueue int
	// MaxQueueWait is the longest a request waits in the queue; then it is
	// shed. 0 means [DefaultMaxQueueWait]. The wait runs on the runtime's
	// timers, not on Now.
	MaxQueueWait time.Duration

	// RetryRatio is the number of retries admitted per original request
	// counted in the window, at most 1. 0 means [DefaultRetryRatio]; a
	// negative value means none (only the floor admits retries).
	RetryRatio float64
	// MinRetriesPerSecond is the floor: retries per second admitted on top
	// of RetryRatio, so MinRetriesPerSecond·Window.Seconds() retries per
	// window are admitted even with no originals. It must be finite. 0
	// means [DefaultMinRetriesPerSecond]; a negative value means no floor.
	MinRetriesPerSecond float64
	// Window is the length of the sliding window, a multiple of Slices
	// nanoseconds with Window/Slices at least 1 ms. 0 means
	// [DefaultWindow].
	Window time.Duration
	// Slices is the number of slices the window is cut into, from 1 to
	// 3600 (see package budget). 0 means [DefaultSlices].
	Slices int

	// RetryAfterBase is the shortest Retry-After a refusal carries. 0
	// means [DefaultRetryAfterBase].
	RetryAfterBase time.Duration
	// RetryAfterSpread is the width of the range a refusal's Retry-After is
	// drawn from: RetryAfterBase + U·RetryAfterSpread with U uniform in
	// [0, 1). 0 means [DefaultRetryAfterSpread]; a negative value means no
	// jitter (every refusal says RetryAfterBase, so the clients that honour
	// it come back together). RetryAfterBase + RetryAfterSpread must not
	// exceed [MaxRetryAfter].
	RetryAfterSpread time.Duration
	// Rand returns uniformly distributed numbers in [0, 1) for the
	// Retry-After jitter (a result outside that range is clamped into it).
	// nil means the runtime's generator (math/rand/v2). The Controller
	// serialises its calls to a Rand it was given, so the Float64 method of
	// a seeded generator that is not safe for concurrent use, such as
	// package backoff's Mulberry32, is fine.
	Rand func() float64

	// Now returns the current time for the window. nil means the monotonic
	// clock (time.Now's reading when the Controller was built, advanced by
	// time.Since). It is called from every request's goroutine, so it must
	// be safe for concurrent use.
	Now func() time.Time
	// Name is the name of what the Controller protects (a service, a
	// route), given as Name to the events it reports; "" for none.
	Name string
	// Observer, if not nil, hears of every decision as an
	// [observe.Admission] event, on the requesting goroutine, before
	// Acquire returns: Outcome "admitted", "shed-retry" (a retry beyond
	// the ratio: [RetryRefused]) or "shed-busy" (no room to run or wait:
	// [QueueFull], [QueueTimeout] or [Canceled], whose name is the event's
	// Reason), and "queued" when a request joins the queue, before its
	// final decision. Attempt is the request's attempt number, Delay the
	// Retry-After of a refusal, Elapsed the time a request waited in the
	// queue (see [Decision]). So every request makes one event, and one
	// more if it queued. The Observer must be quick and safe for
	// concurrent use; it must not call Acquire or Release of the same
	// Controller for the request at hand. nil costs nothing, and the
	// admitted path allocates nothing either way.
	Observer observe.Observer
}

// withDefaults returns c with its zero fields replaced by the defaults, and
// an error wrapping ErrInvalidConfig if a field is out of range.
func (c Config) withDefaults() (Config, error) {
	if c.MaxInFlight == 0 {
		c.MaxInFlight = DefaultMaxInFlight
	}
	if c.MaxQueue == 0 {
		c.MaxQueue = c.MaxInFlight
	}
	if c.MaxQueueWait == 0 {
		c.MaxQueueWait = DefaultMaxQueueWait
	}
	if c.RetryRatio == 0 {
		c.RetryRatio = DefaultRetryRatio
	}
	if c.MinRetriesPerSecond == 0 {
		c.MinRetriesPerSecond = DefaultMinRetriesPerSecond
	}
	if c.Window == 0 {
		c.Window = DefaultWindow
	}
	if c.Slices == 0 {
		c.Slices = DefaultSlices
	}
	if c.RetryAfterBase == 0 {
		c.RetryAfterBase = DefaultRetryAfterBase
	}
	if c.RetryAfterSpread == 0 {
		c.RetryAfterSpread = DefaultRetryAfterSpread
	}
	switch {
	case c.MaxQueueWait < 0:
		return c, fmt.Errorf("%w: max queue wait %v is negative", ErrInvalidConfig, c.MaxQueueWait)
	case math.IsNaN(c.RetryRatio) || c.RetryRatio > 1:
		return c, fmt.Errorf("%w: retry ratio %v must be at most 1", ErrInvalidConfig, c.RetryRatio)
	case math.IsNaN(c.MinRetriesPerSecond) || math.IsInf(c.MinRetriesPerSecond, 0):
		return c, fmt.Errorf("%w: min retries per second %v must be finite", ErrInvalidConfig, c.MinRetriesPerSecond)
	case c.Window < 0:
		return c, fmt.Errorf("%w: window %v is negative", ErrInvalidConfig, c.Window)
	case c.Slices < 0:
		return c, fmt.Errorf("%w: slices %d is negative", ErrInvalidConfig, c.Slices)
	case c.RetryAfterBase < 0:
		return c, fmt.Errorf("%w: retry-after base %v is negative", ErrInvalidConfig, c.RetryAfterBase)
	case c.RetryAfterBase > MaxRetryAfter || c.RetryAfterSpread > MaxRetryAfter-c.RetryAfterBase:
		return c, fmt.Errorf("%w: retry-after base %v + spread %v exceeds %v",
			ErrInvalidConfig, c.RetryAfterBase, c.RetryAfterSpread, MaxRetryAfter)
	}
	return c, nil
}
