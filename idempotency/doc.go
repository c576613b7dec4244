// Package idempotency makes a retried write happen once.
//
// A client creates one key per logical operation with [NewKey], before the
// first attempt, and sends it in the [Header] ("Idempotency-Key") of every
// attempt of that operation. A key created inside the retried callback is the
// classic double-charge bug: each retry then looks like a new operation.
//
// A server wraps its handlers with the middleware [NewMiddleware] returns (after authentication),
// built by [NewMiddleware] on a store: the [MemoryStore] for one process,
// or a store its servers share (modules idempotency/pgstore and
// idempotency/redisstore). The middleware follows the IETF draft "The
// Idempotency-Key HTTP Header Field" and Stripe's behaviour:
//
//	key required but missing, or malformed          400 problem+json
//	  (also: an empty key, two header lines, or
//	  Idempotency-Key and X-Idempotency-Key that differ)
//	request body over the cap                       413 problem+json
//	same key, different fingerprint                 422 problem+json
//	  (method, route, SHA-256 of the body)
//	same key while the first request still runs     409 problem+json, Retry-After
//	first request finished                          the stored status, allow-listed
//	                                                headers and body, plus
//	                                                "Idempotent-Replayed: true"
//	  body over the cap, or no room for it          the same without the body, plus
//	                                                "Idempotent-Body-Omitted: true"
//	store unavailable, full, or silent              503 problem+json, Retry-After;
//	  past the store timeout                        the handler does not run
//
// The key is read from [Header] or, as many clients send it, from
// the older X-Idempotency-Key: 1 to 255 printable ASCII
// characters, bare or as a quoted string ([ParseKey]).
//
// Within the retention period (24 h by default, [WithRetention]) a key's
// handler runs at most once, whatever happens to the response on its way
// to the client: what is stored is what the handler produced, whole (its
// status, allow-listed header fields as they were when it wrote the header,
// and body; not its trailers: a replay carries none; a Content-Type the
// handler left to net/http, which picks one from the first bytes it sends,
// is picked again from the replay's whole body, or left out if the first
// answer's header was flushed before any byte: set it to have it replayed
// exactly), even
// when the client went away mid-response or a [net/http.TimeoutHandler]
// in front gave up; a handler that returns without a word after its
// request was canceled is taken to have produced nothing, and its key is
// released. So a handler that does its work whatever the cancel (a charge
// that ignores its context) must say so: call WriteHeader (200 included)
// before it returns, rather than rely on net/http's implicit 200, or a
// retry after the cancel runs it again. A store
// that fails or is slow while the response is being stored is waited for,
// the key locked meanwhile (see [Guard.Run]), so a brief outage of the
// store does not run a handler twice. The handler runs again only after it
// panicked, ended with a status that is not stored (5xx, 401, 408, 429 by
// default), hijacked the connection, or lost its lock (the store said
// another request holds it, or could confirm none of its renewals for a
// lock timeout, less a twentieth), while it ran or after it returned,
// while its response was being stored (it then never sees
// [ErrLockLost]), or when the store refused its response for a whole
// lock timeout, or its server died before the response was stored; or
// when the store itself lost the key (a Redis that evicts or restarts
// empty, or a redis.Ring that moved it while a shard was out: package
// redisstore, "What the server must keep").
//
// The middleware is an HTTP face on a [Guard], the protocol-neutral core
// built by [NewGuard]: [Guard.Run] claims a key, runs the operation once
// while it keeps the lock alive, stores its record or releases the key,
// and reports a replay, a request in progress or a reused key; it fails
// closed ([ErrStoreUnavailable]) when the store cannot claim. The gRPC
// server interceptor of module grpcretry is built on it too, and so may be
// any other kind of request (a queue consumer, say). Options are typed: a
// [GuardOption] (lock timeout, retention, store timeout, logger, observer,
// name) configures a Guard or the middleware, an [Option] the middleware only.
//
// With [WithObserver], the middleware (or Guard) reports one event per
// keyed request to package observe: its outcome ("new", "replay",
// "in-progress", "mismatch", "invalid", "store-error"), the time spent in
// the store, and the store's error; [WithName] names it. Without an
// observer it reports nothing and pays nothing.
//
// Keys are scoped to the caller (the function of [WithScope] maps each
// request to its tenant, user or API key) and reach the store only as a
// hash of (scope, key): one caller can never read another's stored
// response, and the store never sees a raw key.
//
// A store claims a key with an owner token and a lock timeout (1 min by
// default, [WithLockTimeout]), which the Guard renews while the handler
// runs, so that a slow handler keeps its key while a server that crashes
// mid-request does not block it forever; it keeps a finished response for
// the separate retention period. Every store call is bounded in time (2 s
// by default, [WithStoreTimeout]). A claim whose answer is lost (the store
// timed out or its connection broke once the claim may have been made) is
// answered 503 and released in the background: about a store timeout later, and
// again after doubling pauses while none is found (it may land late), for
// up to a lock timeout, so that the retry runs instead of meeting 409
// until the lock timeout. That takes a store that reports the claim's
// owner token with its error (pgstore and redisstore do; see
// store.Result.Owner). Package idempotency/store defines what
// a store implements, for whoever writes one; idempotency/storetest holds
// the conformance suite every store passes.
package idempotency
