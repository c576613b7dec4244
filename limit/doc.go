// Package limit bounds the attempts in flight to one destination by a
// limit it learns from the destination's latency and drops, and can
// throttle calls locally (client-side adaptive throttling).
package limit
