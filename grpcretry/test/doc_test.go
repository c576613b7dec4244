// Package test holds the end-to-end tests of grpcretry that need more than
// grpcretry's own dependencies: its idempotency interceptor and retrying
// client together over a lossy network, on the in-memory store and on real
// PostgreSQL (pgstore) and Redis (redisstore) servers, driven by the
// harness in internal/keyedtest, which builds on the root module's test
// harness (internal/idemtest).
//
// It is a module of its own, never published (its go.mod says
// //stormguard:unpublished), so that a user of grpcretry downloads no
// PostgreSQL or Redis driver: grpcretry's go.mod requires only grpc and the
// root module. make test runs it with the other modules.
package test
