// Package otelstormguard turns what stormguard's guards do into
// OpenTelemetry metrics and traces: it adapts the one event seam of the core
// (package observe) to an OpenTelemetry meter and tracer. It is a module of
// its own, so that the core needs nothing but the standard library, and it
// depends on the OpenTelemetry API only: the program chooses the SDK and the
// exporters (Prometheus, OTLP) and gives their providers to [NewObserver],
// or installs them as the global ones.
//
//	obs, err := otelstormguard.NewObserver() // the global providers
//	client, err := httpretry.NewClient(httpretry.WithObserver(obs))
//
// The same [Observer] serves every guard: retry.WithObserver for a policy
// of one's own (with retry.WithName for the dependency), the WithObserver
// options of httpretry and grpcretry, admission.Config.Observer, and the
// fleet module's Config.Observer. The test-only module otelstormguard/test
// shows the metrics read back from the SDK and served for Prometheus
// through the OpenTelemetry Prometheus exporter (its examples), and holds
// the tests and benchmarks that need the SDK.
//
// # Metrics
//
// Every metric of the client side carries the dependency as server.address
// and, when the event's Name ends in a port, server.port (the semantic
// conventions' attributes; for httpretry the Name is the destination host,
// otherwise the policy's name). Those of the server side (admission,
// idempotency) carry the guard's name as stormguard.name. An empty Name (a
// policy without retry.WithName, a guard without a name) leaves the
// attribute out, and counts as one dependency among WithMaxDependencies.
//
//	stormguard.attempts                   counter    {attempt}     by stormguard.outcome
//	stormguard.attempt.duration           histogram  s             by stormguard.outcome
//	stormguard.retries                    counter    {retry}       by stormguard.retry.delay_source
//	stormguard.retry.delay                histogram  s             by stormguard.retry.delay_source
//	stormguard.give_ups                   counter    {call}        by stormguard.give_up.reason
//	stormguard.breaker.transitions        counter    {transition}  by stormguard.breaker.from, .to
//	stormguard.breaker.state              gauge      {state}       by stormguard.breaker.state (1 current, 0 others)
//	stormguard.breaker.wait.duration      histogram  s             by stormguard.outcome
//	stormguard.idempotency.outcomes       counter    {request}     by stormguard.outcome
//	stormguard.idempotency.store.duration histogram  s             by stormguard.outcome
//	stormguard.admission.decisions        counter    {decision}    by stormguard.outcome, stormguard.admission.reason
//	stormguard.admission.retry_after      histogram  s             by stormguard.outcome, stormguard.admission.reason
//	stormguard.fleet.mode.transitions     counter    {transition}  by stormguard.fleet.from, .to
//	stormguard.fleet.mode                 gauge      {mode}        by stormguard.fleet.mode (1 current, 0 other)
//	http.client.request.duration          histogram  s             HTTP requests sent (httpretry's attempts)
//
// http.client.request.duration is the HTTP semantic conventions' metric:
// one recording per request the transport sends (each attempt, and a
// resend after a credentials refresh), with http.request.method (a method
// the conventions do not know is "_OTHER"), server.address, server.port
// (the scheme's default if the URL has none), http.response.status_code if
// a response came, and error.type if the request failed (the status code
// from 400 on, else the error's type), in the buckets the conventions
// advise. The methods known are the conventions' list, or those named by
// the environment variable OTEL_INSTRUMENTATION_HTTP_KNOWN_METHODS
// (comma-separated, read by NewObserver), as the conventions ask.
// httpretry records it through [Observer.ObserveHTTP]. With
// otelhttp as the base transport too, the same metric comes twice, under
// two instrumentation scopes: drop one with a View.
//
// The attributes of stormguard's own, for what the semantic conventions
// have no name for:
//
//	stormguard.name                 a server-side guard's name (admission, idempotency)
//	stormguard.outcome              an attempt: success, failure, rejected (an answer that
//	                                is not retried: a 404), canceled (a hedge that lost its
//	                                race, or an attempt that failed after its call's
//	                                deadline); a breaker wait:
//	                                admitted, rejected; an idempotency lookup or admission decision
//	stormguard.attempt              an attempt's number, 1 for the first (spans)
//	stormguard.hedge                true on the span of a hedge (httpretry.WithHedging)
//	stormguard.attempts             the attempts a call made (give-up span events)
//	stormguard.retry.delay_source   backoff, or hint (the server's Retry-After was longer)
//	stormguard.retry.delay          a retry's delay in seconds (span events)
//	stormguard.give_up.reason       not-retryable, attempts-exhausted, deadline, canceled,
//	                                budget-exhausted, circuit-open, limited, panic
//	stormguard.breaker.from, .to    a breaker's change: closed, half-open, open
//	stormguard.breaker.state        the state gauge's state: closed, half-open, open
//	stormguard.breaker.wait         how long a call waited behind an open breaker, in s (span events)
//	stormguard.admission.reason     retry-refused, queue-full, queue-timeout, canceled, deadline
//	stormguard.fleet.from, .to      a fleet's change: fleet, local
//	stormguard.fleet.mode           the mode gauge's mode: fleet, local
//
// A budget refusal is a give-up with reason "budget-exhausted": it has no
// counter of its own, so that a refused call is counted once. The state
// gauges report a breaker or a fleet from its first change on (before it,
// a breaker is closed).
//
// # Traces
//
// Each attempt runs under a span of its own, "stormguard.attempt", started
// by [Observer.TagAttempt] as a child of the span in the caller's context
// (a hedge's too: the hedges of a race are siblings of its first attempt)
// and ended when the attempt ends. It carries server.address, server.port,
// stormguard.attempt (1 for the first), http.request.resend_count (attempt
// − 1, from the second attempt on only), stormguard.outcome and, for a
// failed attempt, error.type (the HTTP status code, or the error's type)
// and the status Error with the error's message. An HTTP attempt (httpretry)
// also carries http.request.method (and http.request.method_original for
// a method the conventions do not know), url.full (user and password
// replaced by REDACTED, as are the values of the query keys the
// conventions name: AWSAccessKeyId, Signature, sig, X-Goog-Signature),
// http.response.status_code, and error.type with the status Error for a
// status from 400 on, all of the attempt's last request (a resend after a
// credentials refresh is part of its attempt: a 401, then a 200, leaves a
// span of the 200 without an error; a hedge's first copy that the race
// canceled has none either). Its kind is CLIENT: each attempt is the
// client span of the request it sends, as the conventions ask of resends. With otelhttp
// or otelgrpc as the base transport, which make a CLIENT span of their own,
// choose INTERNAL ([WithAttemptSpanKind]).
//
// The meter and the tracer are the instrumentation scope [ScopeName] with
// the module's version (see ScopeName).
//
// The loop's decisions are events on the caller's span, the span in the
// context the call was made with: "stormguard.retry" (the failed attempt,
// the delay and its source), "stormguard.breaker.wait" and
// "stormguard.give_up" (the reason and the attempts made). A call made
// without a span of the caller's has no parent for its attempts (each is
// a root span) and nowhere to put those events: start a span around the
// call, or let the server's instrumentation do it.
//
// # Cost
//
// Attribute sets are built once per dependency and label and reused, so a
// steady state of metrics allocates nothing of the observer's own (the
// success path of a retry loop with a budget and a breaker makes no
// allocation with the metrics SDK; see the benchmarks in otelstormguard/test);
// an HTTP request allocates nothing either, but one to a host written
// with upper-case letters (one allocation, to lower-case it) or one that
// got no response (two, for its error.type). Spans allocate what the
// tracing SDK allocates and two of the observer's own (the attempt's
// context). No-op providers (the noop packages of
// the OpenTelemetry API) are recognised and cost no more than the event
// seam itself. The observer never logs.
//
// At most 1024 distinct names ([WithMaxDependencies])
// are kept; the events of further names are reported with the name
// "_OTHER", so that a client that calls arbitrary hosts cannot grow the
// observer's memory or the metrics' cardinality without bound. The
// breaker state gauge of "_OTHER" is then the latest change of any of
// those names' breakers, not a count of them.
package otelstormguard
