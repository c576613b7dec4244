package admission

import (
	"fmt"
	"math"
	"net/http"
	"time"

	"github.com/stormguard/stormguard/observe"
)

// Default settings: a zero field of a Config takes the matching one.
const (
	defaultMaxInFlight         = 1024
	defaultMaxQueueWait        = 500 * time.Millisecond
	defaultRetryRatio          = 0.1
	defaultMinRetriesPerSecond = 1.0
	defaultWindow              = 10 * time.Second
	defaultRetryAfterBase      = time.Second
	defaultRetryAfterSpread    = 10 * time.Second

	// slices is the number of slices the window is cut into (1 s each by
	// default).
	slices = 10
	// maxRetryAfter is the largest RetryAfterBase + RetryAfterSpread.
	maxRetryAfter = 24 * time.Hour
)

// invalid returns the error of a Config field out of range.
func invalid(format string, args ...any) error {
	return fmt.Errorf("admission: invalid config: "+format, args...)
}

// Config is the plain-data description of a [Controller]. Every zero field
// takes its default, so Config{} and Config{MaxInFlight: 100} are valid.
// Where a negative value is allowed it says so; otherwise a negative value
// is an error. A Config holds no state: one value may be shared and reused.
type Config struct {
	// MaxInFlight is the most requests admitted at once (work in
	// progress): a request that finds this many in progress waits in the
	// queue or is shed. 0 means 1024 (Envoy's default for a cluster's
	// max_requests and max_pending_requests); a negative value means no
	// limit (only retries are controlled, nothing queues).
	MaxInFlight int
	// LatencyCeiling, if positive, makes the in-flight limit adaptive:
	// learned from the time the admitted requests take to run (from their
	// slot to Release), between 1 and MaxInFlight, which is then its
	// ceiling and its start and must be positive. A request that runs for
	// LatencyCeiling or longer, or longer than LatencyCeiling/2 and past
	// its caller's deadline or its context's end (its caller left), counts
	// as a drop and cuts the limit; one that runs longer than
	// LatencyCeiling/2 shrinks it, a faster one grows it while it is in use
	// unless its caller left (then it is no sample: see the package
	// documentation). Set it
	// to the longest a caller usefully waits for an answer, such as the
	// clients' attempt timeout. 0 means a fixed limit of MaxInFlight.
	// Release takes a lock while the limit is adaptive.
	LatencyCeiling time.Duration
	// MaxQueue is the most requests that wait for a free slot at once; a
	// request that finds the queue full is shed at once. 0 means the same
	// as MaxInFlight as configured (a queue as deep as the work in
	// progress; with LatencyCeiling, as deep as the limit's highest value,
	// not following the adaptive limit); a negative value means no queue:
	// shed as soon as MaxInFlight are in progress.
	MaxQueue int
	// MaxQueueWait is the longest a request waits in the queue; then it is
	// shed. 0 means 500 ms: a queue absorbs bursts; under sustained
	// overload a request that waited half a second is better answered with
	// a Retry-After that spreads it out than kept waiting longer. It also
	// sets the queue's delay control (see the package documentation): a
	// request that joins a standing queue (one whose requests all waited
	// longer than MaxQueueWait/100 for the last MaxQueueWait/5) waits at
	// most 25 turns of the queue (the mean time between two slots it hands
	// over), within [MaxQueueWait/100, MaxQueueWait/5]; and no request
	// waits past its caller's deadline.
	MaxQueueWait time.Duration

	// RetryRatio is the number of retries admitted per original request
	// counted in the window, at most 1. 0 means 0.1 (the SRE book's 10%); a
	// negative value means none (only the floor admits retries).
	RetryRatio float64
	// MinRetriesPerSecond is the floor: retries per second admitted on top
	// of RetryRatio, so MinRetriesPerSecond·Window.Seconds() retries per
	// window are admitted even with no originals. It must be finite. 0
	// means 1 (10 retries per default window); a negative value means no
	// floor.
	MinRetriesPerSecond float64
	// Window is the length of the sliding window over which originals and
	// retries are counted, cut into ten slices: a multiple of 10
	// nanoseconds of at least 10 ms. 0 means 10 s.
	Window time.Duration

	// RetryAfterBase is the shortest Retry-After a refusal carries. 0
	// means 1 s.
	RetryAfterBase time.Duration
	// RetryAfterSpread is the width of the range a refusal's Retry-After is
	// drawn from: RetryAfterBase + U·RetryAfterSpread with U uniform in
	// [0, 1). 0 means 10 s (with the default base, 1 s to 11 s, which HTTP
	// sends as one of the whole seconds 1 to 10); a negative value means no
	// jitter (every refusal says RetryAfterBase, so the clients that honour
	// it come back together). RetryAfterBase + RetryAfterSpread must not
	// exceed 24 hours.
	RetryAfterSpread time.Duration
	// Rand returns uniformly distributed numbers in [0, 1) for the
	// Retry-After jitter (a result outside that range is clamped into it).
	// nil means the runtime's generator (math/rand/v2). The Controller
	// serialises its calls to a Rand it was given, so the Float64 method of
	// a seeded generator that is not safe for concurrent use is fine.
	Rand func() float64

	// Client, if not nil, names the client of an HTTP request (an API key,
	// a tenant, an address) for [Controller.Wrap], so that one client's
	// retries cannot use the allowance of others: a retry is then admitted
	// only if the global window admits it and, over the same window, that
	// client's admitted retries + 1 <= RetryRatio·its originals + 1 (a
	// floor of one retry per Window per client, so that a quiet client may
	// still retry once in a while; never more than the global floor
	// MinRetriesPerSecond·Window.Seconds(), so 0 when that is negative). "" is a client like any other (all requests it returns "" for
	// share one allowance). Clients are kept in a fixed table of 1,024
	// buckets (80 KiB per Controller) chosen by a hash of the name: two
	// clients that share a bucket share one allowance, and the global
	// window still bounds them, so a collision never admits more than the
	// global ratio. A bucket counts at most 1,048,575 originals (and as
	// many retries) per slice of the window: a client busier than that
	// (a gateway's address) has its allowance capped there. It is called once per request on the serving
	// goroutine; it must be safe for concurrent use and should not
	// allocate (Wrap's admitted path allocates nothing beyond it).
	// [Controller.Acquire] and AcquireProbe have no request and are
	// unaffected, and so is package grpcretry's server interceptor. nil
	// means the global window only.
	Client func(r *http.Request) string

	// Name is the name of what the Controller protects (a service, a
	// route), given as Name to the events it reports; "" for none.
	Name string
	// Observer, if not nil, hears of every decision as an
	// [observe.Admission] event, on the requesting goroutine, before
	// Acquire returns: Outcome "admitted", "shed-retry" (a retry beyond
	// the ratio: [RetryRefused]) or "shed-busy" (no room to run or wait:
	// [QueueFull], [QueueTimeout] or [Canceled], whose name is the event's
	// Reason; "deadline" instead for a request dropped because its
	// caller's deadline passed or could not be met), and "queued" when a request joins the queue, before its
	// final decision. Attempt is the request's attempt number, Delay the
	// Retry-After of a refusal, Elapsed the time a request waited in the
	// queue. So every request makes one event, and one more if it queued.
	// The Observer must be quick and safe for concurrent use; it must not
	// call Acquire or Release of the same Controller for the request at
	// hand. An Observer that panics (or calls runtime.Goexit) on
	// "admitted" or "queued" gives back the slot or the place in the
	// queue the request held: the request does not run, and the panic
	// goes on. nil costs nothing, and the admitted path allocates nothing
	// either way.
	Observer observe.Observer
}

// withDefaults returns c with its zero fields replaced by the defaults, and
// an error if a field is out of range.
func (c Config) withDefaults() (Config, error) {
	if c.MaxInFlight == 0 {
		c.MaxInFlight = defaultMaxInFlight
	}
	if c.MaxQueue == 0 {
		c.MaxQueue = c.MaxInFlight
	}
	if c.MaxQueueWait == 0 {
		c.MaxQueueWait = defaultMaxQueueWait
	}
	if c.RetryRatio == 0 {
		c.RetryRatio = defaultRetryRatio
	}
	if c.MinRetriesPerSecond == 0 {
		c.MinRetriesPerSecond = defaultMinRetriesPerSecond
	}
	if c.Window == 0 {
		c.Window = defaultWindow
	}
	if c.RetryAfterBase == 0 {
		c.RetryAfterBase = defaultRetryAfterBase
	}
	if c.RetryAfterSpread == 0 {
		c.RetryAfterSpread = defaultRetryAfterSpread
	}
	switch {
	case c.LatencyCeiling < 0:
		return c, invalid("LatencyCeiling %v is negative", c.LatencyCeiling)
	case c.LatencyCeiling > 0 && c.MaxInFlight < 0:
		return c, invalid("LatencyCeiling %v needs a positive MaxInFlight, not %d", c.LatencyCeiling, c.MaxInFlight)
	case c.MaxQueueWait < 0:
		return c, invalid("MaxQueueWait %v is negative", c.MaxQueueWait)
	case math.IsNaN(c.RetryRatio) || c.RetryRatio > 1:
		return c, invalid("RetryRatio %v must be at most 1", c.RetryRatio)
	case math.IsNaN(c.MinRetriesPerSecond) || math.IsInf(c.MinRetriesPerSecond, 0):
		return c, invalid("MinRetriesPerSecond %v must be finite", c.MinRetriesPerSecond)
	case c.Window < 0:
		return c, invalid("Window %v is negative", c.Window)
	case c.RetryAfterBase < 0:
		return c, invalid("RetryAfterBase %v is negative", c.RetryAfterBase)
	case c.RetryAfterBase > maxRetryAfter || c.RetryAfterSpread > maxRetryAfter-c.RetryAfterBase:
		return c, invalid("RetryAfterBase %v + RetryAfterSpread %v exceeds %v", c.RetryAfterBase, c.RetryAfterSpread, maxRetryAfter)
	}
	return c, nil
}
