// Package stormguard is the overview of the stormguard modules: retries
// that are safe, spread out and bounded, and writes that happen once. It
// has no code of its own; the work is in the packages below, each named
// after its concept, whose documentation fits a screen or two.
//
// # Where to start
//
// An HTTP client that retries: package
// [github.com/stormguard/stormguard/httpretry] (NewClient, or NewTransport
// over your own RoundTripper). It composes the guards below per destination
// host: up to 3 attempts with full-jitter backoff, Retry-After as a floor,
// one deadline for everything, a retry budget and a circuit breaker.
//
// A server that runs each write once, however often it is retried: the
// middleware of package [github.com/stormguard/stormguard/idempotency]
// (NewMiddleware, with a store), and on the client
// httpretry.WithAutoIdempotencyKey.
//
// Anything else that retries (a database call, a queue): package
// [github.com/stormguard/stormguard/retry] (New, Policy.Do, DoValue).
//
// # The packages of this module (standard library only)
//
//   - [github.com/stormguard/stormguard/backoff]: delays with a cap and jitter.
//   - [github.com/stormguard/stormguard/retry]: the retry loop, its one deadline and why it stopped.
//   - [github.com/stormguard/stormguard/budget]: retries per client held to a share of requests.
//   - [github.com/stormguard/stormguard/breaker]: a circuit breaker that probes and releases paced.
//   - [github.com/stormguard/stormguard/httpretry]: all of the above as an http.RoundTripper.
//   - [github.com/stormguard/stormguard/idempotency]: keys on the client, the middleware on the server, a memory store.
//   - [github.com/stormguard/stormguard/idempotency/store]: what a store implements; storetest checks one.
//   - [github.com/stormguard/stormguard/admission]: the provider's side: refuse retries, bound work in progress.
//   - [github.com/stormguard/stormguard/wire]: the header fields clients and servers share.
//   - [github.com/stormguard/stormguard/observe]: the one event seam every guard reports to.
//
// # The modules beside it (each with its own dependencies)
//
//   - github.com/stormguard/stormguard/idempotency/pgstore: keys in PostgreSQL (pgx).
//   - github.com/stormguard/stormguard/idempotency/redisstore: keys in Redis or a Redis Cluster (go-redis).
//   - github.com/stormguard/stormguard/fleet: one budget and one breaker shared by many processes through Redis.
//   - github.com/stormguard/stormguard/grpcretry: the same rules as gRPC interceptors.
//   - github.com/stormguard/stormguard/otelstormguard: OpenTelemetry metrics and traces of every guard.
//   - github.com/stormguard/stormguard/cmd/stormguard: the CLI: a live retry storm on loopback, and simulations.
//
// The repository's README and docs/ show each measure's effect, with the
// command behind every figure.
package stormguard
