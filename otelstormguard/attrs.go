package otelstormguard

import (
	"maps"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// Attribute keys of stormguard's own, for what OpenTelemetry's semantic
// conventions have no name for (retry loops, breakers, budgets, admission).
// The package documentation lists them with their values.
const (
	// attrName is the name of a server-side guard (admission control,
	// idempotency keys): the Name of its events.
	attrName = attribute.Key("stormguard.name")
	// attrOutcome is the outcome of an attempt ("success", "failure",
	// "rejected", "canceled"), a breaker wait ("admitted", "rejected"), an idempotency
	// lookup or an admission decision.
	attrOutcome = attribute.Key("stormguard.outcome")
	// attrAttempt is an attempt's number, 1 for the first (spans only).
	attrAttempt = attribute.Key("stormguard.attempt")
	// attrHedge marks the span of a hedge (spans only).
	attrHedge = attribute.Key("stormguard.hedge")
	// attrAttempts is the number of attempts a call made (give-up span
	// events).
	attrAttempts = attribute.Key("stormguard.attempts")
	// attrDelaySource says what set a retry's delay: "backoff" or "hint"
	// (the server's Retry-After was longer).
	attrDelaySource = attribute.Key("stormguard.retry.delay_source")
	// attrDelay is a retry's delay in seconds (span events).
	attrDelay = attribute.Key("stormguard.retry.delay")
	// attrGiveUpReason is why a call gave up: "not-retryable",
	// "attempts-exhausted", "deadline", "canceled", "budget-exhausted",
	// "circuit-open", "limited" or "panic" (the tokens of httpretry's
	// give-up header).
	attrGiveUpReason = attribute.Key("stormguard.give_up.reason")
	// attrBreakerFrom and attrBreakerTo are the states of a breaker's
	// change; attrBreakerState is a state of the state gauge ("closed",
	// "half-open", "open").
	attrBreakerFrom  = attribute.Key("stormguard.breaker.from")
	attrBreakerTo    = attribute.Key("stormguard.breaker.to")
	attrBreakerState = attribute.Key("stormguard.breaker.state")
	// attrWait is how long a call waited behind an open breaker, in
	// seconds (span events).
	attrWait = attribute.Key("stormguard.breaker.wait")
	// attrAdmissionReason is the admission controller's own name for a
	// refusal: "retry-refused", "queue-full", "queue-timeout", "canceled",
	// "deadline".
	attrAdmissionReason = attribute.Key("stormguard.admission.reason")
	// attrFleetFrom and attrFleetTo are the modes of a fleet's change;
	// attrFleetMode is a mode of the mode gauge ("fleet", "local").
	attrFleetFrom = attribute.Key("stormguard.fleet.from")
	attrFleetTo   = attribute.Key("stormguard.fleet.to")
	attrFleetMode = attribute.Key("stormguard.fleet.mode")
)

// overflowName stands for every dependency beyond the observer's limit, as
// semantic conventions use "_OTHER" for values outside a known set.
const overflowName = "_OTHER"

// kind says which attribute set a cache entry holds.
type kind uint8

const (
	kindAttempt           kind = iota + 1 // AttemptEnd: outcome
	kindSpan                              // AttemptStart: span start options for attempt n
	kindRetry                             // Retry: delay source
	kindGiveUp                            // GiveUp: reason
	kindWait                              // BreakerWait: outcome
	kindBreakerTransition                 // BreakerState: from, to
	kindBreakerState                      // breaker state gauge: state
	kindIdempotency                       // Idempotency: outcome
	kindAdmission                         // Admission: outcome, reason
	kindFleetTransition                   // FleetMode: from, to
	kindFleetState                        // fleet mode gauge: mode
	kindHTTP                              // an HTTP request: method, status, port, error type
)

// serverSide reports whether the Name of k's events names a server-side
// guard (stormguard.name) rather than a dependency (server.address).
func (k kind) serverSide() bool { return k == kindIdempotency || k == kindAdmission }

// maxCachedAttempt is the highest attempt number whose span options are
// cached; later attempts build theirs on each call.
const maxCachedAttempt = 32

// labels identifies one attribute set of a dependency.
type labels struct {
	kind kind
	n    int // attempt number (kindSpan); status code, 0 for none (kindHTTP)
	port int // server port (kindHTTP)
	a, b string
}

// attrs is one attribute set, as the options each API takes, built once.
type attrs struct {
	add  []metric.AddOption
	rec  []metric.RecordOption
	obs  []metric.ObserveOption
	span []trace.SpanStartOption // kindSpan only
}

// dep is what the observer keeps per dependency (an event's Name): its
// attribute sets. Lookups read an immutable snapshot through one atomic
// load; a new set (rare: once per label) is added under mu to a copy.
type dep struct {
	client   []attribute.KeyValue // server.address[, server.port]
	server   []attribute.KeyValue // stormguard.name
	host     string               // server.address
	spanKind trace.SpanKind

	snap atomic.Pointer[map[labels]*attrs] // never modified once stored
	mu   sync.Mutex
}

func newDep(name string, spanKind trace.SpanKind) *dep {
	d := &dep{spanKind: spanKind}
	if name != "" {
		host, port := splitHostPort(name)
		d.host = host
		d.client = append(d.client, semconv.ServerAddressKey.String(host))
		if port > 0 {
			d.client = append(d.client, semconv.ServerPortKey.Int(port))
		}
		d.server = []attribute.KeyValue{attrName.String(name)}
	}
	d.snap.Store(&map[labels]*attrs{})
	return d
}

// get returns the attribute set l of d, building it on first use.
func (d *dep) get(l labels) *attrs {
	if a := (*d.snap.Load())[l]; a != nil {
		return a
	}
	if l.kind == kindSpan && l.n > maxCachedAttempt {
		return d.build(l)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	old := *d.snap.Load()
	if a := old[l]; a != nil {
		return a
	}
	a := d.build(l)
	publish(&d.snap, old, l, a)
	return a
}

// build makes the attribute set l of d.
func (d *dep) build(l labels) *attrs {
	base := d.client
	if l.kind.serverSide() {
		base = d.server
	}
	kvs := make([]attribute.KeyValue, 0, len(base)+2)
	kvs = append(kvs, base...)
	switch l.kind {
	case kindSpan:
		kvs = append(kvs, attrAttempt.Int(l.n))
		if l.n > 1 {
			kvs = append(kvs, semconv.HTTPRequestResendCountKey.Int(l.n-1))
		}
		return &attrs{span: []trace.SpanStartOption{trace.WithSpanKind(d.spanKind), trace.WithAttributes(kvs...)}}
	case kindAttempt, kindWait, kindIdempotency:
		kvs = append(kvs, attrOutcome.String(l.a))
	case kindRetry:
		kvs = append(kvs, attrDelaySource.String(l.a))
	case kindGiveUp:
		kvs = append(kvs, attrGiveUpReason.String(l.a))
	case kindBreakerTransition:
		kvs = append(kvs, attrBreakerFrom.String(l.a), attrBreakerTo.String(l.b))
	case kindBreakerState:
		kvs = append(kvs, attrBreakerState.String(l.a))
	case kindAdmission:
		kvs = append(kvs, attrOutcome.String(l.a))
		if l.b != "" {
			kvs = append(kvs, attrAdmissionReason.String(l.b))
		}
	case kindFleetTransition:
		kvs = append(kvs, attrFleetFrom.String(l.a), attrFleetTo.String(l.b))
	case kindFleetState:
		kvs = append(kvs, attrFleetMode.String(l.a))
	case kindHTTP:
		// http.client.request.duration: the method, the server (its
		// port, the scheme's default if the URL has none; none for
		// "_OTHER" or a scheme without a default), the
		// status if one came, and error.type if the request failed (the
		// status code from 400 on, else the error's type in b).
		kvs = append(kvs[:0], semconv.HTTPRequestMethodKey.String(l.a))
		if d.host != "" { // a URL without a host: the attribute left out, as for an empty Name
			kvs = append(kvs, semconv.ServerAddressKey.String(d.host))
		}
		if l.port > 0 { // none for "_OTHER", or a URL whose scheme has no default
			kvs = append(kvs, semconv.ServerPortKey.Int(l.port))
		}
		if l.n > 0 {
			kvs = append(kvs, semconv.HTTPResponseStatusCodeKey.Int(l.n))
		}
		if et := httpErrorType(l.n, l.b); et != "" {
			kvs = append(kvs, semconv.ErrorTypeKey.String(et))
		}
	}
	opt := metric.WithAttributeSet(attribute.NewSet(kvs...))
	return &attrs{
		add: []metric.AddOption{opt},
		rec: []metric.RecordOption{opt},
		obs: []metric.ObserveOption{opt},
	}
}

// deps is the bounded table of dependencies, by name. Lookups read an
// immutable snapshot through one atomic load: no lock, no allocation. A
// name beyond the limit is reported as the dependency "_OTHER" (and looks
// the table up under its mutex each time, so the table stays bounded).
type deps struct {
	max      int
	spanKind trace.SpanKind
	other    *dep

	snap atomic.Pointer[map[string]*dep] // never modified once stored
	mu   sync.Mutex
}

func newDeps(max int, spanKind trace.SpanKind) *deps {
	t := &deps{max: max, spanKind: spanKind, other: newDep(overflowName, spanKind)}
	t.snap.Store(&map[string]*dep{})
	return t
}

// get returns the dependency named name.
func (t *deps) get(name string) *dep {
	if d := (*t.snap.Load())[name]; d != nil {
		return d
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	old := *t.snap.Load()
	if d := old[name]; d != nil {
		return d
	}
	if len(old) >= t.max {
		return t.other
	}
	d := newDep(name, t.spanKind)
	publish(&t.snap, old, name, d)
	return d
}

// publish stores in snap a copy of old, the map it holds, with k set to v.
// The caller holds the lock that serialises the writers of snap.
func publish[K comparable, V any](snap *atomic.Pointer[map[K]V], old map[K]V, k K, v V) {
	m := make(map[K]V, len(old)+1)
	maps.Copy(m, old)
	m[k] = v
	snap.Store(&m)
}

// splitHostPort splits a dependency's name into the server address and
// port of the semantic conventions: "api.example.com:8443" gives
// "api.example.com" and 8443, "[::1]:80" gives "::1" and 80. A name
// without a valid port (a bare host, a policy's name, a gRPC target
// with a scheme) is the address as it is, with port 0.
func splitHostPort(name string) (string, int) {
	if len(name) > 2 && name[0] == '[' && name[len(name)-1] == ']' {
		return name[1 : len(name)-1], 0 // an IPv6 literal without a port: the address, unbracketed
	}
	i := strings.LastIndexByte(name, ':')
	if i < 0 {
		return name, 0
	}
	host, p := name[:i], name[i+1:]
	port, err := strconv.Atoi(p)
	if err != nil || port <= 0 || port > 65535 || p[0] == '+' || strings.ContainsRune(host, '/') || host == "" {
		return name, 0
	}
	if strings.HasPrefix(host, "[") && strings.HasSuffix(host, "]") {
		return host[1 : len(host)-1], port
	}
	if strings.ContainsRune(host, ':') { // an IPv6 address without brackets
		return name, 0
	}
	return host, port
}
