package test

import (
	"context"
	"errors"
	"testing"

	metricnoop "go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/stormguard/stormguard/admission"
	"github.com/stormguard/stormguard/breaker"
	"github.com/stormguard/stormguard/budget"
	"github.com/stormguard/stormguard/observe"
	"github.com/stormguard/stormguard/otelstormguard"
	"github.com/stormguard/stormguard/retry"
)

// setups are the observers the benchmarks and the allocation test compare,
// from none to the full SDK. Each builds its observer (nil for none).
var setups = []struct {
	name string
	obs  func(testing.TB) observe.Observer
}{
	{"none", func(testing.TB) observe.Observer { return nil }},
	// An observer that does nothing: what the seam itself costs the loop
	// (its slow path, two clock readings per attempt), before any adapter.
	{"func", func(testing.TB) observe.Observer { return observe.Func(func(context.Context, observe.Event) {}) }},
	{"noop", func(t testing.TB) observe.Observer {
		return mustObserver(t, otelstormguard.WithMeterProvider(metricnoop.NewMeterProvider()),
			otelstormguard.WithTracerProvider(tracenoop.NewTracerProvider()))
	}},
	{"global-unset", func(t testing.TB) observe.Observer { return mustObserver(t) }},
	{"sdk-metrics", func(t testing.TB) observe.Observer {
		return mustObserver(t, otelstormguard.WithMeterProvider(sdkMeterProvider(t)),
			otelstormguard.WithTracerProvider(tracenoop.NewTracerProvider()))
	}},
	{"sdk-metrics-traces", func(t testing.TB) observe.Observer {
		tp := sdktrace.NewTracerProvider() // every span sampled and recorded, exported nowhere
		t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
		return mustObserver(t, otelstormguard.WithMeterProvider(sdkMeterProvider(t)), otelstormguard.WithTracerProvider(tp))
	}},
}

func mustObserver(t testing.TB, opts ...otelstormguard.Option) observe.Observer {
	t.Helper()
	obs, err := otelstormguard.NewObserver(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = obs.Close() })
	return obs
}

// sdkMeterProvider is an SDK meter provider with a manual reader, which
// keeps the aggregates as a pull exporter (Prometheus) does.
func sdkMeterProvider(t testing.TB) *sdkmetric.MeterProvider {
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	return mp
}

// guarded is a policy as httpretry builds one per host: a budget and a
// breaker (the defaults, or the given configs) on the real clock, a name,
// and obs.
func guarded(t testing.TB, obs observe.Observer, bc budget.Config, kc breaker.Config, opts ...retry.Option) *retry.Policy {
	t.Helper()
	bud, err := budget.New(bc)
	if err != nil {
		t.Fatal(err)
	}
	brk, err := breaker.New(kc)
	if err != nil {
		t.Fatal(err)
	}
	p, err := retry.New(append([]retry.Option{retry.WithGuards(retry.Guards{Budget: bud, Breaker: brk}),
		retry.WithName("api.example.com:443"), retry.WithObserver(obs)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func succeed(context.Context, int) error { return nil }

var errFlaky = errors.New("flaky")

// failOnce fails its first attempt: one retry per call.
func failOnce(_ context.Context, attempt int) error {
	if attempt == 1 {
		return errFlaky
	}
	return nil
}

// BenchmarkDoSuccessBudgetBreaker is the success path of the retry loop
// with a budget and a breaker (retry's benchmark of the same name), without
// an observer and with the adapter on each setup.
func BenchmarkDoSuccessBudgetBreaker(b *testing.B) {
	for _, s := range setups {
		b.Run(s.name, func(b *testing.B) {
			p := guarded(b, s.obs(b), budget.Config{}, breaker.Config{})
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				if err := p.Do(ctx, succeed); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkDoOneRetry is a call whose first attempt fails: two attempts, a
// retry (with a backoff whose delays are 0) and their events. The budget
// allows a retry per call and the breaker trips only if every call fails.
func BenchmarkDoOneRetry(b *testing.B) {
	for _, s := range setups {
		b.Run(s.name, func(b *testing.B) {
			p := guarded(b, s.obs(b), budget.Config{Ratio: 1}, breaker.Config{FailureRatio: 1},
				retry.WithBackoff(zeroDelays()), retry.WithClassifier(func(error) bool { return true }))
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				if err := p.Do(ctx, failOnce); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkDoSuccessParallel is the success path from every P at once, on
// one policy and one observer.
func BenchmarkDoSuccessParallel(b *testing.B) {
	for _, s := range setups {
		b.Run(s.name, func(b *testing.B) {
			p := guarded(b, s.obs(b), budget.Config{}, breaker.Config{})
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				ctx := context.Background()
				for pb.Next() {
					if err := p.Do(ctx, succeed); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// The success path allocates nothing without an observer, with the
// adapter on no-op providers, and, once its attribute sets are built, with
// the adapter on the metrics SDK: metrics in a steady state cost no
// allocation. (Spans do: see the benchmarks.)
func TestSuccessPathAllocs(t *testing.T) {
	for _, s := range setups {
		if s.name == "sdk-metrics-traces" || s.name == "global-unset" {
			continue
		}
		p := guarded(t, s.obs(t), budget.Config{}, breaker.Config{})
		ctx := context.Background()
		if n := testing.AllocsPerRun(1000, func() { _ = p.Do(ctx, succeed) }); n != 0 {
			t.Errorf("%s: %v allocs per successful call, want 0", s.name, n)
		}
	}
}

// BenchmarkAdmissionAcquire is an admitted request at admission control
// (Acquire and Release), without an observer and with the adapter on each
// setup.
func BenchmarkAdmissionAcquire(b *testing.B) {
	for _, s := range setups {
		b.Run(s.name, func(b *testing.B) {
			ctl := admitAll(b, s.obs(b))
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				p, _ := ctl.Acquire(ctx, 1)
				p.Release()
			}
		})
	}
}

// admitAll is an admission controller named "checkout" that reports to obs.
func admitAll(t testing.TB, obs observe.Observer) *admission.Controller {
	t.Helper()
	ctl, err := admission.New(admission.Config{Name: "checkout", Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	return ctl
}

// An admitted request allocates nothing with the adapter on the metrics
// SDK either.
func TestAdmissionAllocs(t *testing.T) {
	for _, s := range setups {
		if s.name == "global-unset" || s.name == "sdk-metrics-traces" {
			continue
		}
		ctl := admitAll(t, s.obs(t))
		ctx := context.Background()
		if n := testing.AllocsPerRun(1000, func() {
			p, _ := ctl.Acquire(ctx, 1)
			p.Release()
		}); n != 0 {
			t.Errorf("%s: %v allocs per admitted request, want 0", s.name, n)
		}
	}
}
