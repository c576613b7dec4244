package otelstormguard

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/stormguard/stormguard/observe"
)

// ScopeName is the instrumentation scope of the meter and the tracer the
// observer uses: the module's path. The scope's version is the module's
// version in the program's build information (debug.ReadBuildInfo), the
// release the program requires; in a program built from the module's
// source (a workspace, a replace by a directory) or without build
// information, the version the source is released as (v0.1.0).
const ScopeName = "github.com/stormguard/stormguard/otelstormguard"

// defaultMaxDependencies is the number of distinct dependencies (event
// names) an [Observer] keeps attribute sets for by default.
const defaultMaxDependencies = 1024

// Option configures [NewObserver]. Options are immutable and safe to share.
type Option func(*config)

type config struct {
	mp       metric.MeterProvider
	tp       trace.TracerProvider
	spanKind trace.SpanKind
	maxDeps  int
}

// WithMeterProvider sets the meter provider the metrics are created with.
// nil (the default) means the global one, [otel.GetMeterProvider]; a
// provider of package go.opentelemetry.io/otel/metric/noop turns the
// metrics off at no cost.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(c *config) { c.mp = mp }
}

// WithTracerProvider sets the tracer provider the attempt spans are started
// with. nil (the default) means the global one, [otel.GetTracerProvider]; a
// provider of package go.opentelemetry.io/otel/trace/noop turns the spans
// off at no cost.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(c *config) { c.tp = tp }
}

// WithAttemptSpanKind sets the kind of the attempt spans. The default,
// [trace.SpanKindClient], makes each attempt span the client span of the
// request it sends, as the semantic conventions ask of a resend (one
// CLIENT span per attempt; a resend after a credentials refresh is part of
// its attempt). Use [trace.SpanKindInternal] when the
// protocol's own instrumentation (otelhttp, otelgrpc as the base
// transport) makes a client span of its own under each attempt, so that
// each request has one CLIENT span. An invalid kind means the default.
func WithAttemptSpanKind(k trace.SpanKind) Option {
	return func(c *config) { c.spanKind = k }
}

// WithMaxDependencies bounds the number of distinct dependencies (event
// names) the observer keeps attribute sets and gauge states for; the
// events of any further name are reported with the name "_OTHER". n <= 0
// means 1024.
func WithMaxDependencies(n int) Option {
	return func(c *config) { c.maxDeps = n }
}

// Observer turns stormguard's events (package observe) into OpenTelemetry
// metrics and spans. Build one with [NewObserver] and hand it to the guards
// (httpretry.WithObserver, retry.WithObserver, admission.Config.Observer,
// fleet's Config.Observer, ...); one Observer may serve them all.
//
// It tags attempts ([Observer.TagAttempt], see observe.Observer): each
// attempt runs under a span of its own. Attribute sets are built once per dependency and label and then
// reused, so that in a steady state a metric update allocates nothing of
// the observer's own. It never logs. An Observer is safe for concurrent
// use.
type Observer struct {
	metrics bool // false: a no-op meter provider
	traces  bool // false: a no-op tracer provider
	tracer  trace.Tracer
	deps    *deps

	knownMethods map[string]bool     // OTEL_INSTRUMENTATION_HTTP_KNOWN_METHODS at NewObserver; nil: the conventions' list
	reg          metric.Registration // the gauges' callback; nil without metrics

	attempts, retries, giveUps               metric.Int64Counter
	attemptDuration, retryDelay, breakerWait metric.Float64Histogram
	httpDuration                             metric.Float64Histogram
	breakerTransitions, fleetTransitions     metric.Int64Counter
	idemOutcomes, admissionDecisions         metric.Int64Counter
	idemStoreDuration, admissionRetryAfter   metric.Float64Histogram
	breakerState, fleetMode                  metric.Int64ObservableGauge

	stateMu       sync.Mutex
	breakerStates map[*dep]string // guarded by stateMu: the latest state per dependency
	fleetModes    map[*dep]string // guarded by stateMu: the latest mode per fleet
}

var (
	_ observe.Observer = (*Observer)(nil)
	_ interface {
		TagAttempt(context.Context, observe.Event) context.Context
	} = (*Observer)(nil)
)

// Histogram bucket boundaries, in seconds: the HTTP semantic conventions'
// advice for http.client.request.duration; the same with a bucket for 0
// for the durations of attempts and store calls; and a longer range for
// delays (backoffs, Retry-After, breaker waits).
var (
	httpBuckets     = []float64{0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10}
	durationBuckets = []float64{0, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10}
	delayBuckets    = []float64{0, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300}
)

// The states the gauges report, one series each.
var (
	breakerStateNames = []string{"closed", "half-open", "open"}
	fleetModeNames    = []string{"fleet", "local"}
)

// NewObserver returns an Observer that records to the given providers (the
// global ones by default). It creates its instruments (see the package
// documentation for their names and units) and registers the callback of
// the two state gauges; [Observer.Close] unregisters it. It returns an
// error if the meter provider refuses an instrument.
func NewObserver(opts ...Option) (*Observer, error) {
	c := config{spanKind: trace.SpanKindClient, maxDeps: defaultMaxDependencies}
	for _, opt := range opts {
		if opt != nil {
			opt(&c)
		}
	}
	if c.mp == nil {
		c.mp = otel.GetMeterProvider()
	}
	if c.tp == nil {
		c.tp = otel.GetTracerProvider()
	}
	if c.maxDeps <= 0 {
		c.maxDeps = defaultMaxDependencies
	}
	if c.spanKind < trace.SpanKindInternal || c.spanKind > trace.SpanKindConsumer {
		c.spanKind = trace.SpanKindClient
	}
	o := &Observer{
		deps:          newDeps(c.maxDeps, c.spanKind),
		breakerStates: map[*dep]string{},
		fleetModes:    map[*dep]string{},
	}
	switch c.tp.(type) {
	case tracenoop.TracerProvider, *tracenoop.TracerProvider:
	default:
		o.traces = true
		o.tracer = c.tp.Tracer(ScopeName, trace.WithInstrumentationVersion(version), trace.WithSchemaURL(semconv.SchemaURL))
	}
	o.knownMethods = knownMethods(os.Getenv("OTEL_INSTRUMENTATION_HTTP_KNOWN_METHODS"))
	switch c.mp.(type) {
	case metricnoop.MeterProvider, *metricnoop.MeterProvider:
	default:
		o.metrics = true
		if err := o.instruments(c.mp.Meter(ScopeName, metric.WithInstrumentationVersion(version), metric.WithSchemaURL(semconv.SchemaURL))); err != nil {
			return nil, err
		}
	}
	return o, nil
}

// knownMethods returns the set of HTTP methods a comma-separated list
// names (OTEL_INSTRUMENTATION_HTTP_KNOWN_METHODS, which the semantic
// conventions give for overriding the methods known; case-sensitive, as
// methods are), nil for an empty list: the conventions' own.
func knownMethods(list string) map[string]bool {
	var m map[string]bool
	for _, f := range strings.Split(list, ",") {
		if f = strings.TrimSpace(f); f != "" {
			if m == nil {
				m = map[string]bool{}
			}
			m[f] = true
		}
	}
	return m
}

// instruments creates the instruments on m.
func (o *Observer) instruments(m metric.Meter) error {
	var errs []error
	counter := func(name, unit, desc string) metric.Int64Counter {
		c, err := m.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	histogram := func(name, desc string, buckets []float64) metric.Float64Histogram {
		h, err := m.Float64Histogram(name, metric.WithUnit("s"), metric.WithDescription(desc), metric.WithExplicitBucketBoundaries(buckets...))
		errs = append(errs, err)
		return h
	}
	gauge := func(name, unit, desc string) metric.Int64ObservableGauge {
		g, err := m.Int64ObservableGauge(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return g
	}
	o.attempts = counter("stormguard.attempts", "{attempt}", "Attempts made, by outcome.")
	o.attemptDuration = histogram("stormguard.attempt.duration", "Duration of attempts, by outcome.", durationBuckets)
	o.httpDuration = histogram("http.client.request.duration", "Duration of HTTP client requests.", httpBuckets)
	o.retries = counter("stormguard.retries", "{retry}", "Retries decided, by what set the delay.")
	o.retryDelay = histogram("stormguard.retry.delay", "Delay slept before a retry, by what set it.", delayBuckets)
	o.giveUps = counter("stormguard.give_ups", "{call}", "Calls that ended without success, by reason (a budget refusal is reason \"budget-exhausted\").")
	o.breakerTransitions = counter("stormguard.breaker.transitions", "{transition}", "Circuit breaker state changes.")
	o.breakerState = gauge("stormguard.breaker.state", "{state}", "1 for the state a circuit breaker is in, 0 for the others; a breaker appears at its first change.")
	o.breakerWait = histogram("stormguard.breaker.wait.duration", "Time calls waited behind an open circuit breaker, by outcome.", delayBuckets)
	o.idemOutcomes = counter("stormguard.idempotency.outcomes", "{request}", "Keyed requests the idempotency guard handled, by outcome.")
	o.idemStoreDuration = histogram("stormguard.idempotency.store.duration", "Time the idempotency guard spent in its store per request, by outcome.", durationBuckets)
	o.admissionDecisions = counter("stormguard.admission.decisions", "{decision}", "Admission decisions, by outcome (a request that queued makes a queued decision and a final one).")
	o.admissionRetryAfter = histogram("stormguard.admission.retry_after", "Retry-After given with each shed request, by outcome.", delayBuckets)
	o.fleetTransitions = counter("stormguard.fleet.mode.transitions", "{transition}", "Fleet mode changes of a shared budget or breaker.")
	o.fleetMode = gauge("stormguard.fleet.mode", "{mode}", "1 for the mode a fleet-shared guard is in, 0 for the other; a fleet appears at its first change.")
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("otelstormguard: create instruments: %w", err)
	}
	reg, err := m.RegisterCallback(o.observeStates, o.breakerState, o.fleetMode)
	if err != nil {
		return fmt.Errorf("otelstormguard: register the state gauges: %w", err)
	}
	o.reg = reg
	return nil
}

// Close unregisters the callback of the state gauges, so that the meter
// provider stops calling into o. o may still be used; its gauges then
// report nothing. Close is safe to call more than once.
func (o *Observer) Close() error {
	if o.reg == nil {
		return nil
	}
	if err := o.reg.Unregister(); err != nil {
		return fmt.Errorf("otelstormguard: unregister the state gauges: %w", err)
	}
	return nil
}

// attemptSpanKey is the context key of the span TagAttempt started.
type attemptSpanKey struct{}

// TagAttempt starts the span of an attempt (e.Kind AttemptStart) as a
// child of the span in ctx and returns the context that carries it. The
// span is named "stormguard.attempt", of kind CLIENT unless
// [WithAttemptSpanKind] says otherwise; it has server.address and
// server.port (the dependency), stormguard.attempt (the attempt number)
// and, on every attempt after the first, http.request.resend_count
// (attempt - 1). The AttemptEnd event of the attempt ends it. For any other
// kind of event, and without tracing, it returns ctx.
func (o *Observer) TagAttempt(ctx context.Context, e observe.Event) context.Context {
	if !o.traces || e.Kind != observe.AttemptStart {
		return ctx
	}
	a := o.deps.get(e.Name).get(labels{kind: kindSpan, n: e.Attempt})
	parent := trace.SpanFromContext(ctx)
	if t, ok := attemptSpan(ctx); ok && e.Hedge && t.span == parent {
		// A hedge starts on its race's first attempt's context: its span
		// is that attempt's sibling, under the caller's span. (Another
		// call made inside an attempt is no hedge: its attempts are that
		// attempt's children.)
		parent = t.parent
		ctx = trace.ContextWithSpan(ctx, parent)
	}
	ctx, span := o.tracer.Start(ctx, "stormguard.attempt", a.span...)
	return context.WithValue(ctx, attemptSpanKey{}, &attemptTag{span: span, parent: parent, name: e.Name, attempt: e.Attempt})
}

// attemptTag is the context value of an attempt TagAttempt started: its
// span, and the attempt's name and number, so that the AttemptEnd of
// another call made within the attempt (an inner policy whose observer
// does not tag) does not end this one's span.
type attemptTag struct {
	span    trace.Span
	parent  trace.Span // the span in the context TagAttempt was given
	name    string
	attempt int

	// The last HTTP request of the attempt (ObserveHTTP): its error.type
	// ("" for a success) and status message, and whether it was canceled;
	// the span takes them when the attempt ends. Guarded by mu: an
	// operation may send several requests at once within one attempt.
	mu              sync.Mutex
	errType, errMsg string
	canceled        bool

	// inner counts the attempts of the same name and number started within
	// this one that no TagAttempt tagged (an inner policy whose observer
	// cannot tag), whose AttemptEnd has not come: their ends are theirs,
	// not this attempt's. Any goroutine of the attempt may start one.
	inner atomic.Int32
}

// attemptSpan returns the span of the attempt TagAttempt started in ctx,
// if any.
func attemptSpan(ctx context.Context) (*attemptTag, bool) {
	t, ok := ctx.Value(attemptSpanKey{}).(*attemptTag)
	return t, ok
}

// Observe records e: see the package documentation for what each kind of
// event feeds.
func (o *Observer) Observe(ctx context.Context, e observe.Event) {
	switch e.Kind {
	case observe.AttemptStart:
		// Told, not tagged: an attempt whose policy's observer does not
		// tag. Within a tagged attempt of the same name and number, its
		// end must not end that attempt's span.
		if t, ok := attemptSpan(ctx); ok && o.traces && t.name == e.Name && t.attempt == e.Attempt {
			t.inner.Add(1)
		}
	case observe.AttemptEnd:
		o.attemptEnd(ctx, e)
	case observe.Retry:
		if o.metrics {
			a := o.attrs(e.Name, labels{kind: kindRetry, a: e.Outcome})
			o.retries.Add(ctx, 1, a.add...)
			o.retryDelay.Record(ctx, e.Delay.Seconds(), a.rec...)
		}
		if o.traces {
			if span := trace.SpanFromContext(ctx); span.IsRecording() {
				span.AddEvent("stormguard.retry", trace.WithAttributes(
					attrAttempt.Int(e.Attempt), attrDelay.Float64(e.Delay.Seconds()), attrDelaySource.String(e.Outcome)))
			}
		}
	case observe.GiveUp:
		if o.metrics {
			o.giveUps.Add(ctx, 1, o.attrs(e.Name, labels{kind: kindGiveUp, a: e.Reason}).add...)
		}
		if o.traces {
			if span := trace.SpanFromContext(ctx); span.IsRecording() {
				span.AddEvent("stormguard.give_up", trace.WithAttributes(
					attrGiveUpReason.String(e.Reason), attrAttempts.Int(e.Attempt)))
			}
		}
	case observe.BreakerWait:
		if o.metrics {
			o.breakerWait.Record(ctx, e.Elapsed.Seconds(), o.attrs(e.Name, labels{kind: kindWait, a: e.Outcome}).rec...)
		}
		if o.traces {
			if span := trace.SpanFromContext(ctx); span.IsRecording() {
				span.AddEvent("stormguard.breaker.wait", trace.WithAttributes(
					attrWait.Float64(e.Elapsed.Seconds()), attrOutcome.String(e.Outcome)))
			}
		}
	case observe.BreakerState:
		if o.metrics {
			d := o.deps.get(e.Name)
			if e.To == "" {
				// Forgotten by its layer's table: no transition, and the
				// gauge drops it, as for a destination not seen yet; but
				// "_OTHER" stays the latest change of the names past the
				// bound (forgetting one is no change of the others).
				if d != o.deps.other {
					o.setState(o.breakerStates, d, "")
				}
				break
			}
			o.breakerTransitions.Add(ctx, 1, d.get(labels{kind: kindBreakerTransition, a: e.From, b: e.To}).add...)
			o.setState(o.breakerStates, d, e.To)
		}
	case observe.Idempotency:
		if o.metrics {
			a := o.attrs(e.Name, labels{kind: kindIdempotency, a: e.Outcome})
			o.idemOutcomes.Add(ctx, 1, a.add...)
			o.idemStoreDuration.Record(ctx, e.Elapsed.Seconds(), a.rec...)
		}
	case observe.Admission:
		if o.metrics {
			a := o.attrs(e.Name, labels{kind: kindAdmission, a: e.Outcome, b: e.Reason})
			o.admissionDecisions.Add(ctx, 1, a.add...)
			if e.Delay > 0 {
				o.admissionRetryAfter.Record(ctx, e.Delay.Seconds(), a.rec...)
			}
		}
	case observe.FleetMode:
		if o.metrics {
			d := o.deps.get(e.Name)
			o.fleetTransitions.Add(ctx, 1, d.get(labels{kind: kindFleetTransition, a: e.From, b: e.To}).add...)
			o.setState(o.fleetModes, d, e.To)
		}
	}
}

// attrs returns the attribute set l of the dependency named name.
func (o *Observer) attrs(name string, l labels) *attrs {
	return o.deps.get(name).get(l)
}

// attemptEnd records the end of an attempt and ends its span.
func (o *Observer) attemptEnd(ctx context.Context, e observe.Event) {
	if o.metrics {
		a := o.attrs(e.Name, labels{kind: kindAttempt, a: e.Outcome})
		o.attempts.Add(ctx, 1, a.add...)
		o.attemptDuration.Record(ctx, e.Elapsed.Seconds(), a.rec...)
	}
	if !o.traces {
		return
	}
	tag, ok := attemptSpan(ctx)
	if !ok || tag.name != e.Name || tag.attempt != e.Attempt {
		return // not an attempt this observer tagged: its span is another's
	}
	for n := tag.inner.Load(); n > 0; n = tag.inner.Load() {
		if tag.inner.CompareAndSwap(n, n-1) {
			return // the end of an untagged attempt started within this one
		}
	}
	span := tag.span
	if span.IsRecording() {
		span.SetAttributes(attrOutcome.String(e.Outcome))
		if e.Hedge {
			span.SetAttributes(attrHedge.Bool(true))
		}
		tag.mu.Lock()
		errType, errMsg, canceled := tag.errType, tag.errMsg, tag.canceled
		tag.mu.Unlock()
		switch {
		case e.Outcome != "success" && e.Err != nil:
			span.SetAttributes(semconv.ErrorTypeKey.String(errorType(e.Err)))
			span.SetStatus(codes.Error, e.Err.Error())
		case errType != "" && !(e.Outcome == "success" && canceled):
			// The last request's error (a 404 the caller gets); not a copy
			// the race canceled because another won.
			span.SetAttributes(semconv.ErrorTypeKey.String(errType))
			span.SetStatus(codes.Error, errMsg)
		case e.Outcome == "failure":
			// A failure told without its error (an event of a producer of
			// one's own): failed all the same.
			span.SetAttributes(semconv.ErrorTypeKey.String("_OTHER"))
			span.SetStatus(codes.Error, e.Outcome)
		}
	}
	span.End()
}

// errorType is the error.type of an attempt's error: the status code of an
// error that carries one (httpretry's StatusError), else the type of the
// innermost error.
func errorType(err error) string {
	var sc interface{ StatusCode() int }
	if errors.As(err, &sc) {
		return strconv.Itoa(sc.StatusCode())
	}
	for {
		u := errors.Unwrap(err)
		if u == nil {
			break
		}
		err = u
	}
	return semconv.ErrorType(err).Value.AsString()
}

// setState records the latest state of a breaker or fleet for its gauge.
func (o *Observer) setState(states map[*dep]string, d *dep, state string) {
	o.stateMu.Lock()
	if state == "" {
		delete(states, d)
	} else {
		states[d] = state
	}
	o.stateMu.Unlock()
}

// observeStates is the callback of the state gauges: one series per state
// and dependency, 1 for the state it is in and 0 for the others.
func (o *Observer) observeStates(_ context.Context, obs metric.Observer) error {
	o.stateMu.Lock()
	defer o.stateMu.Unlock()
	observeState(obs, o.breakerState, o.breakerStates, kindBreakerState, breakerStateNames)
	observeState(obs, o.fleetMode, o.fleetModes, kindFleetState, fleetModeNames)
	return nil
}

func observeState(obs metric.Observer, g metric.Int64Observable, states map[*dep]string, k kind, names []string) {
	for d, cur := range states {
		known := false
		for _, s := range names {
			v := int64(0)
			if s == cur {
				v, known = 1, true
			}
			obs.ObserveInt64(g, v, d.get(labels{kind: k, a: s}).obs...)
		}
		if !known { // a state outside the known set still shows
			obs.ObserveInt64(g, 1, d.get(labels{kind: k, a: cur}).obs...)
		}
	}
}
