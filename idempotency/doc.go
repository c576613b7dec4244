// Package idempotency makes a retried write happen once.
//
// A client creates one key per logical operation with [NewKey], before the
// first attempt, and sends it in the [Header] ("Idempotency-Key") of every
// attempt of that operation. A key created inside the retried callback is the
// classic double-charge bug: each retry then looks like a new operation.
//
// A server wraps its handlers with a [Middleware] (after authentication). The
// middleware follows the IETF draft "The Idempotency-Key HTTP Header Field"
// and Stripe's behaviour:
//
//	key required but missing, or malformed          400 problem+json
//	request body over the cap                       413 problem+json
//	same key, different fingerprint                 422 problem+json
//	  (method, route, SHA-256 of the body)
//	same key while the first request still runs     409 problem+json, Retry-After
//	first request finished                          the stored status, allow-listed
//	                                                headers and body, plus
//	                                                "Idempotent-Replayed: true"
//	store unavailable or full                       503 problem+json, Retry-After;
//	                                                the handler does not run
//
// Keys are scoped to the caller (a scope function maps each request to its
// tenant, user or API key) and reach the [Store] only as a SHA-256 hash of
// (scope, key): one caller can never read another's stored response, and the
// store never sees a raw key.
//
// A [Store] claims a key with an owner token and a lock timeout, so that a
// server that crashes mid-request does not block the key forever, and keeps a
// finished response for a separate retention period. The package ships the
// in-memory [MemoryStore]; PostgreSQL and Redis stores live in their own
// modules (idempotency/pgstore and idempotency/redisstore), and
// idempotency/storetest holds the conformance suite every store passes.
package idempotency
