// Package grpcretry applies stormguard's retry rules to gRPC: client
// interceptors that retry what is worth retrying, per target, behind a
// retry budget, a circuit breaker and a concurrency limiter, honouring the
// server's pushback; and
// server interceptors for admission control and idempotency keys.
//
//	opts, err := grpcretry.DialOptions(grpcretry.WithIdempotentMethods("/shop.Catalog/GetItem"))
//	...
//	conn, err := grpc.NewClient(addr, append(opts, creds)...)
//	...
//	ctx, cancel := context.WithTimeout(ctx, 5*time.Second) // the call's deadline, its retries included
//
// # What is retried
//
// A call is safe to repeat when its method is declared idempotent
// ([WithIdempotentMethods]) or it carries an idempotency key in its
// outgoing metadata under "idempotency-key" (idempotency.Header: gRPC
// lower-cases metadata keys, and metadata.AppendToOutgoingContext(ctx,
// idempotency.Header, key) sends it; [WithAutoIdempotencyKey] adds one per
// call, made once before the first attempt and sent on every attempt). A call that is not
// safe to repeat gets exactly one attempt. For a call that is:
//
//	| code                 | retried?                                    | breaker   |
//	| -------------------- | ------------------------------------------- | --------- |
//	| UNAVAILABLE          | yes                                         | failure   |
//	| RESOURCE_EXHAUSTED   | only with a server hint (pushback >= 0 or   | failure   |
//	|                      | RetryInfo), which is the floor of the wait  | with hint |
//	| DEADLINE_EXCEEDED    | only when the attempt's own timeout         | failure   |
//	|                      | ([WithAttemptTimeout]) cut it off and the   | if so     |
//	|                      | call still has time; never the caller's     |           |
//	| INTERNAL             | once, and only for an idempotent method     | failure   |
//	| ABORTED              | for an idempotent method; for a keyed call  | failure   |
//	|                      | with a server hint (the key's first request | if retried|
//	|                      | still runs on the server)                   |           |
//	| any other code       | no                                          | success   |
//	| any code, with a     | no: the layer below said stop               | as above  |
//	| pushback < 0 or      |                                             |           |
//	| malformed            |                                             |           |
//
// "breaker" says how the target's circuit breaker counts the attempt: a
// failure of the target, or an answer (the target is up; the call was
// wrong). Failures of calls that may not be repeated count too. A call
// canceled by its caller counts neither way.
//
// The call options of a unary call go to each of its attempts and hedges,
// but for grpc.OnFinish: its callbacks run once per call, when the call
// returns, with the error it returns (as gRPC runs them), never once per
// attempt or per copy. (A stream's attempts each run them.)
//
// # Delays and server hints
//
// Full-jitter backoff by default (package backoff, through
// [WithRetry](retry.WithBackoff(...))). A server hint is a floor on the
// next wait: the trailer "grpc-retry-pushback-ms: N" (wire.PushbackMetadata)
// and a google.rpc.RetryInfo in the status details; with both, the longer
// one. The wait is spread above the floor by up to half of it again, drawn
// from the backoff's random source (so that clients told the same do not
// return in step; a source that returns 0 sleeps the hint exactly). A hint past the call's deadline, or above the maximum
// (retry.WithMaxRetryAfter, 1 minute by default), ends the call at once
// (Reason retry.Deadline): the loop never sleeps past the deadline. A
// negative or malformed pushback, or several pushback values, mean "do not
// retry": the call stops with that answer, as grpc-go's own retry reads it
// (strconv.Atoi: a sign is read, a space or a number beyond 64 bits is
// malformed).
//
// # One layer retries
//
// Every attempt after the first carries "grpc-previous-rpc-attempts: N"
// (wire.PreviousAttemptsMetadata; absent on a first attempt, and removed
// from a first attempt whose outgoing metadata carried one), which
// admission control reads ([AdmissionServerOptions]); an attempt that the
// breaker let through to test the target (a probe, or the first send of a
// call released after waiting) also carries "stormguard-probe: 1" (the
// gRPC form of wire.ProbeHeader), which admission does not count as a
// retry beyond its ratio; gRPC's own deadline tells the server how long
// the caller waits. Both marks are the client's own: those a caller's
// outgoing metadata carries from elsewhere (a proxy forwarding the
// metadata it got) are never sent on, by any call, a stream the client
// passes through included (each attempt carries the client's own marks
// or none), so that the next server never counts an original as a
// retry. A server handler whose own call to a dependency gave up tells
// its caller not to retry on top with [PushBack]: the trailer
// "grpc-retry-pushback-ms: -1" and UNAVAILABLE. With three services in a chain, each retrying up to 3
// times, the bottom one then sees 3 attempts, not 27.
//
// # Streams
//
// A server-streaming call of a method that is safe to repeat (see the table) is retried until the first response (its first
// message, or its header if the caller asks for it with Header) reaches the
// caller: the stream opens when the caller first asks for a response, with
// the request message kept for replay; once a response arrived, the stream
// is the caller's and later failures are returned as they come. A
// client-streaming or bidirectional call passes through (never retried,
// not guarded) unless [WithBufferMessages] is given: then the
// messages it sends are kept, up to the bound, and replayed on a new stream
// when an attempt fails before the first response; a message past the
// bound commits the call to the attempt that sends it. The replay goes
// beside the caller's receives: a send blocked on flow control never holds
// up a receive on another goroutine (see [WithBufferMessages]). Sent
// messages are kept by reference: as grpc-go asks, a caller must not
// modify a message after sending it. A stream of a method that is not safe to repeat passes
// through too (not guarded: its failures are not counted, and
// an open breaker does not hold it). A stream passed through is opened
// once, with the caller's context, call options and messages as they are,
// but for its outgoing metadata: an attempt count or probe mark inherited
// from elsewhere is removed from it (see One layer retries), and nothing
// is added (no idempotency key). A stream has no fallback.
//
// # grpc-go's own retry
//
// grpc-go retries by itself when the service config has a retryPolicy for
// the method, and the two would multiply (3 x 3 attempts).
// [DialOptions], the one way to install this package's client, includes
// grpc.WithDisableRetry, so that only this package retries. grpc-go still
// retries, transparently and within one attempt, a call whose stream the
// server never processed (refused, or left behind a GOAWAY): nothing
// reached the application, so nothing multiplies. A call that never
// reached the server fails its attempt with UNAVAILABLE (a connection
// refused, closed or lost, whatever grpc-go's message), which is retried
// like any UNAVAILABLE.
//
// # Giving up
//
// A call that ends without success returns an [*Error] (but one whose
// guards could not be had: see [WithGuards]): it reads as a gRPC
// status (status.Code(err) is the last attempt's code; UNAVAILABLE when an
// open circuit refused the call before any attempt) and wraps the
// [*retry.Error] that says why the retrying stopped (errors.Is with
// retry.AttemptsExhausted, retry.Deadline, retry.CircuitOpen, ...): a
// caller that serves a reply from elsewhere (cached data) when the target's
// failure defeated the call tests those reasons.
//
// Each target (grpc.ClientConn.Target) gets its own retry budget, circuit
// breaker and concurrency limiter (package limit; [WithBudget],
// [WithBreaker], [WithLimit], each on by default, nil for off), kept in a
// table of at most 1024 targets; [WithGuards] supplies shared ones (a
// fleet's). A call that meets an open breaker waits for it when its
// deadline allows (see retry.WithGuards). The limiter bounds the attempts
// in flight to the target by a limit it learns from the target's latency
// and drops (a cold one starts at 10 and doubles per round trip while the
// target keeps up); an attempt over it waits for a slot, earliest deadline
// first, calls without a deadline after those with one.
//
// # Hedging
//
// [WithHedging] sends a copy of a slow unary call of a method the caller
// declares safe to send twice at the same time, after a fixed delay or the
// learned quantile of the target's recent answers: paid from the target's
// retry budget, never while its breaker is not closed, its limiter is
// full, it pushed back, or its latency is inflated; the first good answer
// wins and the others are canceled. Streams are never hedged.
//
// # Servers
//
// [AdmissionServerOptions] puts calls through an admission.Controller: a retry beyond the fleet's
// ratio is refused before the handler runs with UNAVAILABLE and the
// don't-retry pushback; a call shed for lack of room gets UNAVAILABLE with
// a jittered pushback (and RetryInfo).
//
// [IdempotencyUnaryServerInterceptor] is the server half of idempotency
// keys, the gRPC twin of idempotency.NewMiddleware, built on the same core
// (idempotency.Guard) and stores (memory, PostgreSQL, Redis): a unary call
// carrying an idempotency key runs at most once per key and caller, and a
// retry gets the stored answer (the reply, or the status with its
// details) marked "idempotent-replayed: true" (idempotency.ReplayHeader
// in lower case: header.Get(idempotency.ReplayHeader) reads it). A retry while the first
// call runs gets ABORTED with a pushback, which this package's client
// retries for a keyed call; a key reused for another call gets
// FAILED_PRECONDITION; a malformed key INVALID_ARGUMENT; a store that is
// down UNAVAILABLE, and the handler never runs unguarded.
//
// The interceptors are silent unless given a logger ([WithLogger]) or an
// observer ([WithObserver], events named with the target). Time is the
// system clock's, which a testing/synctest bubble fakes in tests.
package grpcretry
