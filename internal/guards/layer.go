package guards

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/limit"
	"github.com/stormguard/stormguard/observe"
	"github.com/stormguard/stormguard/retry"
)

// Layer is what a protocol layer knows to build its destinations: the
// user's schedule of retries, the layer's classifier, the configurations of
// the guards (or a func that supplies them), a logger and an observer. A
// Layer is not modified once in use.
type Layer struct {
	// Component names the layer in errors and log messages ("httpretry");
	// Label is the destination's attribute in log records ("host").
	Component, Label string
	// Schedule are the user's schedule options; Classify is the layer's
	// classifier.
	Schedule []retry.ScheduleOption
	Classify func(error) bool
	// Budget and Breaker are the configurations each destination's guards
	// are built from (nil: none), unless Supply gives them.
	Budget  *budget.Config
	Breaker *breaker.Config
	Supply  func(name string) (retry.Guards, error)
	// Limit is the configuration each destination's concurrency limiter
	// is built from (nil: none), its zero Timeout taking AttemptTimeout,
	// the layer's cap on one attempt (0: none). It applies to supplied
	// guards too, when they bring no limiter of their own. With
	// LimitPaces, a breaker the layer builds beside the limiter, with
	// ReleaseRate 0, releases its waiting calls at once (ReleaseRate -1):
	// the limiter's slots pace them, not the rate seen before the trip.
	// Without it (the adapters' default limiter, which a client that
	// carries one call at a time never reaches) the breaker keeps its own
	// paced release.
	Limit          *limit.Config
	LimitPaces     bool
	AttemptTimeout time.Duration
	// Logger (not yet labelled) and Observer are the layer's; nil means
	// silent.
	Logger   *slog.Logger
	Observer observe.Observer
}

// Destination is one destination's guards and the retry policy that uses
// them. It is immutable once made.
type Destination struct {
	Name   string
	Guards retry.Guards
	Policy *retry.Policy
	Logger *slog.Logger // labelled with the destination; nil: silent
	// Hint caps Guards.Limiter at a server's capacity hint; nil when the
	// limiter is not the layer's own (supplied, or none).
	Hint *CapHint

	news *breakerNews // the state changes of the layer's own breaker, nil if none or no observer
}

// breakerNews carries the state changes of a breaker the layer built to
// the layer's observer, until the destination is forgotten.
type breakerNews struct {
	obs  observe.Observer
	mu   sync.Mutex   // orders the changes told and the forgetting
	gone bool         // guarded by mu: forgotten, changes no longer told
	prev *Destination // guarded by mu: the destination of the same name this one followed, to be forgotten first (see Follow)
}

// tell reports a change of the breaker of destination name, unless the
// destination was forgotten; the destination of the same name it
// followed, if any, is forgotten first.
func (n *breakerNews) tell(name string, from, to breaker.State) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if p := n.prev; p != nil {
		n.prev = nil
		p.Forget()
	}
	if !n.gone {
		n.obs.Observe(context.Background(), observe.Event{Kind: observe.BreakerState, Name: name, From: from.String(), To: to.String()})
	}
}

// Forget tells the layer's observer that d's breaker, built by the layer,
// is gone (the table of destinations evicted d to make room): a
// BreakerState event with From its state, To "" and Reason "forgotten";
// the changes the breaker may still go through (calls in flight hold it)
// are not told. A destination whose breaker was supplied (a fleet's, which
// it hands back if the destination returns), or that has no breaker or no
// observer, tells nothing.
func (d *Destination) Forget() {
	n := d.news
	if n == nil {
		return
	}
	b := d.Guards.Breaker
	if b == nil {
		return
	}
	st := b.State() // may start a probe round, told by tell: not under n.mu
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.gone {
		return
	}
	n.gone = true
	n.obs.Observe(context.Background(), observe.Event{Kind: observe.BreakerState, Name: d.Name, From: st.String(), Reason: "forgotten"})
}

// Follow records that d was built for the name of prev, which the table
// of destinations evicted and has not forgotten yet: d's first change is
// told after prev's forgetting (prev.Forget, which then tells nothing
// more), so that the observer does not take the old breaker's forgetting
// for the end of d's. It is a no-op unless both have a breaker the layer
// built. Call it before d is used.
func (d *Destination) Follow(prev *Destination) {
	n := d.news
	if n == nil || prev.news == nil {
		return
	}
	n.mu.Lock()
	n.prev = prev
	n.mu.Unlock()
}

// New builds the destination named name, in one pass down the layers: its
// guards (supplied, or built from the configurations), then the policy on
// them. It is the one place a destination's guards come from.
func (l *Layer) New(name string) (*Destination, error) {
	d := &Destination{Name: name}
	if l.Logger != nil {
		d.Logger = l.Logger.With(slog.String(l.Label, name))
	}
	var err error
	var built *limit.Limiter
	if d.Guards, built, d.news, err = l.guards(name, d.Logger); err != nil {
		return nil, fmt.Errorf("%s: guards for %s %q: %w", l.Component, l.Label, name, err)
	}
	d.Hint = newCapHint(built)
	opts := make([]retry.Option, 0, len(l.Schedule)+4)
	for _, o := range l.Schedule {
		opts = append(opts, o)
	}
	opts = append(opts,
		retry.WithClassifier(l.Classify),
		retry.WithName(name),
		retry.WithObserver(withLogger(l.Observer, d.Logger)),
		retry.WithGuards(d.Guards),
	)
	if d.Policy, err = retry.New(opts...); err != nil {
		return nil, fmt.Errorf("%s: %w", l.Component, err)
	}
	return d, nil
}

// Check builds a destination as New does, without calling Supply, so that
// a bad schedule option or guard configuration is reported when the
// protocol layer is built, never by a call.
func (l *Layer) Check() error {
	c := *l
	c.Supply = nil
	_, err := c.New("")
	return err
}

// guards returns the guards of the destination named name: supplied (with
// a limiter built from Limit if they bring none), or built from the
// configurations (nil for those not configured), the
// breaker's state changes going to its configured callback, a Warn to
// logger and a BreakerState event to the layer's observer. built is the
// limiter the layer built, nil if none (or a supplied one).
func (l *Layer) guards(name string, logger *slog.Logger) (g retry.Guards, built *limit.Limiter, news *breakerNews, err error) {
	if l.Supply != nil {
		if g, err = l.Supply(name); err != nil {
			return g, nil, nil, err
		}
		if bb, ok := g.Budget.(*budget.Budget); ok && bb == nil {
			g.Budget = nil // a typed nil is no budget, for the loop and for hedges alike
		}
		if g.Limiter != nil {
			return g, nil, nil, nil
		}
		g.Limiter, err = l.limiter()
		return g, g.Limiter, nil, err
	}
	lim, err := l.limiter()
	if err != nil {
		return retry.Guards{}, nil, nil, err
	}
	g.Limiter = lim
	if l.Budget != nil {
		b, err := budget.New(*l.Budget)
		if err != nil {
			return retry.Guards{}, nil, nil, err
		}
		g.Budget = b
	}
	if l.Breaker != nil {
		if l.Observer != nil {
			news = &breakerNews{obs: l.Observer}
		}
		cfg := *l.Breaker
		cfg.OnStateChange = l.stateChange(name, logger, news, cfg.OnStateChange)
		if lim != nil && l.LimitPaces && cfg.ReleaseRate == 0 {
			cfg.ReleaseRate = -1 // the limiter paces the release
		}
		b, err := breaker.New(cfg)
		if err != nil {
			return retry.Guards{}, nil, nil, err
		}
		g.Breaker = b
	}
	return g, lim, news, nil
}

// limiter returns a new limiter built from l.Limit, nil if none is
// configured.
func (l *Layer) limiter() (*limit.Limiter, error) {
	if l.Limit == nil {
		return nil, nil
	}
	cfg := *l.Limit
	if cfg.Timeout == 0 {
		cfg.Timeout = l.AttemptTimeout
	}
	return limit.New(cfg)
}

// stateChange returns the state-change callback of the breaker of the
// destination named name: user (if not nil), a Warn to logger and an event
// to the layer's observer through news (nil: none). With neither logger
// nor news it returns user.
func (l *Layer) stateChange(name string, logger *slog.Logger, news *breakerNews, user func(from, to breaker.State)) func(from, to breaker.State) {
	if logger == nil && news == nil {
		return user
	}
	msg := l.Component + ": circuit breaker state change"
	return func(from, to breaker.State) {
		if logger != nil {
			logger.LogAttrs(context.Background(), slog.LevelWarn, msg,
				slog.String("from", from.String()), slog.String("to", to.String()))
		}
		if news != nil {
			news.tell(name, from, to)
		}
		if user != nil {
			user(from, to)
		}
	}
}

// withLogger returns the observer of a destination's policy: obs, and, with
// a logger, a Debug record of each retry ("retry: retrying") and each
// give-up ("retry: giving up"), the event as a group under the key "retry":
// per-call records are for debugging, never a log storm during an outage
// (the breaker's state changes are the events worth a Warn).
func withLogger(obs observe.Observer, logger *slog.Logger) observe.Observer {
	if logger == nil {
		return obs
	}
	o := &logObserver{next: obs, logger: logger}
	o.tagger, _ = obs.(attemptTagger)
	return o
}

// attemptTagger is an observer that gives each attempt a context of its
// own (see observe.Observer).
type attemptTagger interface {
	TagAttempt(ctx context.Context, e observe.Event) context.Context
}

// logObserver logs the loop's retries and give-ups and passes every event
// on to next (if not nil), attempt tagging included.
type logObserver struct {
	next   observe.Observer
	tagger attemptTagger // next, if it tags attempts
	logger *slog.Logger
}

func (o *logObserver) Observe(ctx context.Context, e observe.Event) {
	if o.next != nil {
		o.next.Observe(ctx, e)
	}
	if (e.Kind != observe.Retry && e.Kind != observe.GiveUp) || !o.logger.Enabled(ctx, slog.LevelDebug) {
		return
	}
	msg := "retry: retrying"
	attrs := make([]any, 0, 4)
	if e.Kind == observe.Retry {
		attrs = append(attrs, slog.Int("attempt", e.Attempt), slog.Duration("delay", e.Delay))
		if hint := retry.RetryAfter(e.Err); hint > 0 {
			attrs = append(attrs, slog.Duration("retry_after", hint))
		}
	} else {
		msg = "retry: giving up"
		attrs = append(attrs, slog.String("reason", e.Reason), slog.Int("attempts", e.Attempt))
		if e.Delay > 0 {
			attrs = append(attrs, slog.Duration("delay", e.Delay))
		}
	}
	attrs = append(attrs, slog.Any("error", e.Err))
	o.logger.LogAttrs(ctx, slog.LevelDebug, msg, slog.Group("retry", attrs...))
}

// TagAttempt passes an attempt's start to next: its tag, if it tags.
func (o *logObserver) TagAttempt(ctx context.Context, e observe.Event) context.Context {
	if o.tagger != nil {
		return o.tagger.TagAttempt(ctx, e)
	}
	if o.next != nil {
		o.next.Observe(ctx, e)
	}
	return ctx
}
