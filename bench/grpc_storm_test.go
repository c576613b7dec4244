package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	mwretry "github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/retry"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/status"

	"github.com/stormguard/stormguard/grpcretry"
)

// The live gRPC storm: a fleet of 1000 clients, each making one unary call
// a second (seeded random phases, a 2 s deadline per call), against a
// loopback provider that answers UNAVAILABLE for 10 s. Counted at the
// provider: the attempts that arrive during the outage, divided by the
// calls the clients started during it (the offered load; a client whose
// call is still running starts its next one late, so a setup whose calls
// wait offers less) and by the calls scheduled in it (1000 x 10). One run
// per setup, each 2 s before the outage, 10 s of it and 3 s after.
//
// The setups: stormguard (one set of grpcretry.DialOptions shared by the fleet, so one
// budget and one breaker per target, as a gateway or sidecar has, or a
// fleet through grpcretry.WithGuards), grpc-go's own retry (service config
// retryPolicy, 3 attempts, 0.1 s initial backoff), the same with grpc-go's
// retryThrottling (maxTokens 10, tokenRatio 0.1), and go-grpc-middleware
// v2's retry interceptor (WithMax(3), UNAVAILABLE, its default 50 ms
// backoff). The fleet sends through 10 connections per setup.
//
// TestGRPCStorm takes about a minute of real time and runs only when
// STORMGUARD_LIVE_GRPC=1 is set.

const (
	stormClients  = 1000
	stormEvery    = time.Second
	stormDeadline = 2 * time.Second
	stormBefore   = 2 * time.Second
	stormOutage   = 10 * time.Second
	stormAfter    = 3 * time.Second
	stormConns    = 10
)

// stormProvider fails during the outage and counts attempts by phase.
type stormProvider struct {
	testpb.UnimplementedTestServiceServer
	down        atomic.Bool
	during, all atomic.Int64
	offered     atomic.Int64 // calls the clients started during the outage
}

func (p *stormProvider) UnaryCall(ctx context.Context, req *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
	p.all.Add(1)
	if p.down.Load() {
		p.during.Add(1)
		return nil, status.Error(codes.Unavailable, "outage")
	}
	return &testpb.SimpleResponse{}, nil
}

// stormSetup is one retry setup of the fleet: dial options for all of its
// connections.
type stormSetup struct {
	name string
	opts func(tb testing.TB) []grpc.DialOption
}

func stormSetups() []stormSetup {
	throttled := `{"retryThrottling":{"maxTokens":10,"tokenRatio":0.1},` + grpcServiceConfig("0.1s")[1:]
	return []stormSetup{
		{"stormguard (one shared Client)", func(tb testing.TB) []grpc.DialOption {
			c, err := grpcretry.DialOptions(grpcretry.WithIdempotentMethods(testpb.TestService_UnaryCall_FullMethodName))
			if err != nil {
				tb.Fatal(err)
			}
			return c
		}},
		{"grpc-go retryPolicy", func(testing.TB) []grpc.DialOption {
			return []grpc.DialOption{grpc.WithDefaultServiceConfig(grpcServiceConfig("0.1s"))}
		}},
		{"grpc-go retryPolicy + retryThrottling", func(testing.TB) []grpc.DialOption {
			return []grpc.DialOption{grpc.WithDefaultServiceConfig(throttled)}
		}},
		{"go-grpc-middleware v2", func(testing.TB) []grpc.DialOption {
			return []grpc.DialOption{grpc.WithChainUnaryInterceptor(mwretry.UnaryClientInterceptor(mwretry.WithMax(3), mwretry.WithCodes(codes.Unavailable)))}
		}},
	}
}

// stormResult is one setup's row.
type stormResult struct {
	name              string
	offered, attempts int64
	ok, failed        int64 // calls of the whole run
}

func (r stormResult) ratio() float64 { return float64(r.attempts) / float64(r.offered) }

// runStorm runs the fleet against a fresh provider through setup s.
func runStorm(t *testing.T, s stormSetup, seed uint64) stormResult {
	p := &stormProvider{}
	addr := startGRPC(t, p)
	opts := s.opts(t)
	clients := make([]testpb.TestServiceClient, stormConns)
	for i := range clients {
		clients[i] = dialGRPC(t, addr, opts)
	}
	ctx, stop := context.WithCancel(t.Context())
	defer stop()
	start := time.Now()
	var ok, failed atomic.Int64
	var wg sync.WaitGroup
	rng := rand.New(rand.NewPCG(seed, 1))
	for i := range stormClients {
		client := clients[i%stormConns]
		phase := time.Duration(rng.Int64N(int64(stormEvery)))
		wg.Go(func() {
			next := start.Add(phase)
			for {
				select {
				case <-ctx.Done():
					return
				case <-time.After(time.Until(next)):
				}
				next = next.Add(stormEvery)
				if p.down.Load() {
					p.offered.Add(1)
				}
				cctx, cancel := context.WithTimeout(ctx, stormDeadline)
				_, err := client.UnaryCall(cctx, &testpb.SimpleRequest{})
				cancel()
				if err == nil {
					ok.Add(1)
				} else if ctx.Err() == nil {
					failed.Add(1)
				}
			}
		})
	}
	time.Sleep(stormBefore)
	p.down.Store(true)
	time.Sleep(stormOutage)
	p.down.Store(false)
	time.Sleep(stormAfter)
	stop()
	wg.Wait()
	return stormResult{name: s.name, offered: p.offered.Load(), attempts: p.during.Load(), ok: ok.Load(), failed: failed.Load()}
}

// TestGRPCStorm runs the storm for every setup and prints the table.
func TestGRPCStorm(t *testing.T) {
	if os.Getenv("STORMGUARD_LIVE_GRPC") != "1" {
		t.Skip("live gRPC storm (about a minute): set STORMGUARD_LIVE_GRPC=1")
	}
	var rows []stormResult
	for i, s := range stormSetups() {
		rows = append(rows, runStorm(t, s, uint64(42+i)))
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d clients, 1 call/s each, %v deadline; UNAVAILABLE for %v\n", stormClients, stormDeadline, stormOutage)
	scheduled := int64(stormClients * int(stormOutage/stormEvery))
	fmt.Fprintf(&b, "| setup | calls started during outage (offered) | attempts during outage | attempts / offered | attempts / %d scheduled | calls ok / failed (whole run) |\n|---|---:|---:|---:|---:|---:|\n", scheduled)
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %d | %d | %.2fx | %.2fx | %d / %d |\n", r.name, r.offered, r.attempts, r.ratio(),
			float64(r.attempts)/float64(scheduled), r.ok, r.failed)
	}
	t.Log("\n" + b.String())
	sg := rows[0]
	if sg.ratio() > 1.1 {
		t.Errorf("stormguard: %.2fx the offered load during the outage, want at most 1.1x", sg.ratio())
	}
	for _, r := range rows[1:] {
		if sg.ratio() >= r.ratio() {
			t.Errorf("stormguard %.2fx is not below %s %.2fx", sg.ratio(), r.name, r.ratio())
		}
	}
}
