package admission_test

import (
	"context"
	"net/http"
	"strconv"
	"testing"

	"github.com/stormguard/stormguard/admission"
	"github.com/stormguard/stormguard/wire"
)

// okHandler is the bare handler the middleware benchmarks wrap.
var okHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })

// benchServe runs h for one request (with the given attempt header, none
// if empty) per iteration.
func benchServe(b *testing.B, h http.Handler, attempt string) {
	r := request(0)
	if attempt != "" {
		r.Header[wire.AttemptHeader] = []string{attempt}
	}
	w := &nopWriter{h: http.Header{}}
	b.ReportAllocs()
	for b.Loop() {
		h.ServeHTTP(w, r)
	}
}

// BenchmarkBareHandler is the baseline: the handler alone.
func BenchmarkBareHandler(b *testing.B) {
	benchServe(b, okHandler, "")
}

// BenchmarkWrapOriginal is an original (no attempt header) admitted through
// the middleware with the default config and the real clock.
func BenchmarkWrapOriginal(b *testing.B) {
	benchServe(b, newController(b, admission.Config{}).Wrap(okHandler), "")
}

// BenchmarkWrapOriginalObserved is BenchmarkWrapOriginal with an observer
// that counts the events: what the observer seam itself costs.
func BenchmarkWrapOriginalObserved(b *testing.B) {
	ctl := newController(b, admission.Config{Name: "pay", Observer: new(counter)})
	benchServe(b, ctl.Wrap(okHandler), "")
}

// BenchmarkWrapRetry is a retry within the ratio (a high floor admits all).
func BenchmarkWrapRetry(b *testing.B) {
	ctl := newController(b, admission.Config{MinRetriesPerSecond: 1e9})
	benchServe(b, ctl.Wrap(okHandler), "2")
}

// BenchmarkWrapRetryRefused is a retry beyond the ratio: the 503 with its
// headers, written to a writer that keeps nothing.
func BenchmarkWrapRetryRefused(b *testing.B) {
	ctl := newController(b, admission.Config{MinRetriesPerSecond: -1})
	benchServe(b, ctl.Wrap(okHandler), "2")
}

// BenchmarkWrapShedFull is an original shed because the only slot is
// taken and there is no queue.
func BenchmarkWrapShedFull(b *testing.B) {
	ctl := newController(b, admission.Config{MaxInFlight: 1, MaxQueue: -1})
	p, _ := ctl.Acquire(context.Background(), 1)
	defer p.Release()
	benchServe(b, ctl.Wrap(okHandler), "")
}

// BenchmarkWrapOriginalParallel is the admitted path from every P at once
// (slots never run out: the limit is above the number of goroutines).
func BenchmarkWrapOriginalParallel(b *testing.B) {
	h := newController(b, admission.Config{}).Wrap(okHandler)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		r := request(0)
		w := &nopWriter{h: http.Header{}}
		for pb.Next() {
			h.ServeHTTP(w, r)
		}
	})
}

// BenchmarkAcquireRelease is the protocol-neutral core alone.
func BenchmarkAcquireRelease(b *testing.B) {
	ctl := newController(b, admission.Config{})
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		p, _ := ctl.Acquire(ctx, 1)
		p.Release()
	}
}

// BenchmarkAcquireQueued is a request that queues and gets a slot handed
// over: two goroutines share one slot, so nearly every Acquire waits.
func BenchmarkAcquireQueued(b *testing.B) {
	ctl := newController(b, admission.Config{MaxInFlight: 1, MaxQueue: 4, MaxQueueWait: 1 << 40})
	ctx := context.Background()
	b.ReportAllocs()
	b.SetParallelism(2)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			p, _ := ctl.Acquire(ctx, 1)
			p.Release()
		}
	})
}

// BenchmarkWrapOriginalFields is BenchmarkWrapOriginal with a request that
// carries fields the handler does not read, as requests do: 3 (what Go's
// client sends and a trace context) and 8 (behind a proxy).
func BenchmarkWrapOriginalFields(b *testing.B) {
	names := []string{"User-Agent", "Accept-Encoding", "Traceparent", "X-Forwarded-For", "X-Forwarded-Proto", "X-Request-Id", "Accept", "Content-Type"}
	for _, n := range []int{3, 8} {
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			h := newController(b, admission.Config{}).Wrap(okHandler)
			r := request(0)
			for _, name := range names[:n] {
				r.Header[name] = []string{"v"}
			}
			w := &nopWriter{h: http.Header{}}
			b.ReportAllocs()
			for b.Loop() {
				h.ServeHTTP(w, r)
			}
		})
	}
}

// BenchmarkWrapKeyed is a keyed original (a new idempotency key each time,
// from a cycle of 65,536 that the key table cannot hold, so that every
// request looks its key up and records it): the key table's cost.
func BenchmarkWrapKeyed(b *testing.B) {
	ctl := newController(b, admission.Config{MinRetriesPerSecond: 1e9})
	h := ctl.Wrap(okHandler)
	keys := make([][]string, 1<<16)
	for i := range keys {
		keys[i] = []string{"pay-" + strconv.Itoa(i)}
	}
	r := request(0)
	w := &nopWriter{h: http.Header{}}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		r.Header["Idempotency-Key"] = keys[i&(len(keys)-1)]
		i++
		h.ServeHTTP(w, r)
	}
}
