// Package test holds the tests of otelstormguard that record through the
// OpenTelemetry SDK: metrics read back from an in-memory reader, spans from
// a span recorder, the Prometheus exposition through the OpenTelemetry
// Prometheus exporter, the examples that print what was recorded, and the
// benchmarks of the observer with the SDK behind it.
//
// It is a module of its own, never published (its go.mod says
// //stormguard:unpublished), as the OpenTelemetry-Go contrib
// instrumentations keep their SDK tests: otelstormguard depends on the
// OpenTelemetry API only, so that its users download no SDK and no
// exporter. make test runs it with the other modules.
package test
