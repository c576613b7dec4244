package idemtest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stormguard/stormguard/idempotency"
	"github.com/stormguard/stormguard/wire"
)

// Drive makes payments 0 to n-1, calling pay for each on one of workers
// goroutines, and returns once every call returned. Once ctx has ended no
// new payment starts.
func Drive(ctx context.Context, n, workers int, pay func(ctx context.Context, i int)) {
	jobs := make(chan int)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := range jobs {
				pay(ctx, i)
			}
		})
	}
	for i := range n {
		if ctx.Err() != nil {
			break
		}
		jobs <- i
	}
	close(jobs)
	wg.Wait()
}

// driver makes the payments.
type driver struct {
	ledger *Ledger
	client *http.Client
	url    string
	cfg    Config
	keys   []string  // keys[i]: payment i's key; each written by one worker
	bufs   sync.Pool // of *bytes.Buffer: the answers read (16 KiB in hostile runs)

	calls, attempts, redrives, gaveUp, conflicts, replays atomic.Int64
	keyErrors, failed, badReplays, badAnswers             atomic.Int64
	longestBusy                                           atomic.Int64 // nanoseconds: the longest run of 409s a payment got past

	mu   sync.Mutex // guards errs
	errs []string
}

// maxErrors bounds Result.Errors.
const maxErrors = 5

func (d *driver) fail(format string, args ...any) {
	d.failed.Add(1)
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.errs) < maxErrors {
		d.errs = append(d.errs, fmt.Sprintf(format, args...))
	}
}

// outcome is how a call ended.
type outcome int

const (
	succeeded outcome = iota
	unknown           // not known to be applied: send again with the same key
	rejected          // an answer that sending again cannot fix
	busy              // 409: another request holds the key; send again with it
)

// pay makes payment i: a first call through the transport's automatic key,
// then, while the payment is not known to be applied, re-drives with the
// same key.
//
// A 409 (in progress) says another request holds the key: its holder may
// still apply the payment, or release the key for the next try. The driver
// keeps re-driving while the 409s have lasted less than
// [Config.InProgressWait] (counted from the first 409 since the last other
// answer), and those re-drives do not count towards [Config.MaxRedrives]:
// how long a holder takes depends on the machine's load (a store blip's
// settling backs off), not on the code under test, while a key left held
// until the middleware's lock timeout is a defect the wait still catches.
//
// Why the key is taken from the wire: the main path must leave the key to
// [httpretry.WithAutoIdempotencyKey], so the driver never sees it. But
// when that call fails (the transport gave up, or 409) the payment may or
// may not have been applied; sending it with a new key could apply it
// twice, and not sending it could lose it. So keyTap, the base transport
// under the retrying one, records the key every attempt carries into a
// slot in the request's context; the re-drive sends that key explicitly
// (the transport keeps a caller's key as is). This also checks the
// transport: every attempt of one call must carry one and the same key.
// If no attempt was sent at all, no key exists and none was used: the
// re-drive makes a new one.
func (d *driver) pay(ctx context.Context, i int) {
	id := PaymentID(i)
	body, _ := json.Marshal(Payment{ID: id, AmountCents: 100 + int64(i%900)})
	slot := &keySlot{}
	ctx = context.WithValue(ctx, slotKey{}, slot)
	out, why := d.call(ctx, id, body, "", slot)
	var busySince time.Time // the first 409 of the current run of them
	for r, n := 0, 0; out == unknown || out == busy; n++ {
		if out == busy && d.cfg.InProgressWait > 0 {
			if busySince.IsZero() {
				busySince = time.Now()
			}
			if held := time.Since(busySince); held >= d.cfg.InProgressWait {
				d.fail("%s: still in progress after %v of 409s (%d re-drives)", id, held.Round(time.Millisecond), n)
				d.keys[i] = slot.get()
				return
			}
		} else {
			d.endBusy(&busySince)
			if r == d.cfg.MaxRedrives {
				d.fail("%s: no success after %d re-drives: %s", id, r, why)
				d.keys[i] = slot.get()
				return
			}
			r++
		}
		// A short pause: a 409 means the first request still runs.
		t := time.NewTimer(time.Duration(min(n+1, maxPauseSteps)) * pauseStep)
		select {
		case <-ctx.Done():
			t.Stop()
			d.fail("%s: %v", id, ctx.Err())
			return
		case <-t.C:
		}
		key := slot.get()
		if key == "" {
			key = idempotency.NewKey()
		}
		d.redrives.Add(1)
		out, why = d.call(ctx, id, body, key, slot)
	}
	d.endBusy(&busySince)
	d.keys[i] = slot.get()
	if out == rejected {
		d.fail("%s: %s", id, why)
	}
}

// The pause before the n-th re-drive of a payment (from 0) is
// min(n+1, maxPauseSteps) pauseSteps: 2 ms, 4 ms, ... up to 50 ms.
const (
	pauseStep     = 2 * time.Millisecond
	maxPauseSteps = 25
)

// endBusy ends the run of 409s that began at *since, if one did, with an
// answer other than 409: it records its length and clears *since.
func (d *driver) endBusy(since *time.Time) {
	if since.IsZero() {
		return
	}
	held := int64(time.Since(*since))
	*since = time.Time{}
	for {
		old := d.longestBusy.Load()
		if held <= old || d.longestBusy.CompareAndSwap(old, held) {
			return
		}
	}
}

// call makes one client call for payment id; key "" leaves the key to the
// transport.
func (d *driver) call(ctx context.Context, id string, body []byte, key string, slot *keySlot) (outcome, string) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.url, bytes.NewReader(body))
	if err != nil {
		return rejected, err.Error()
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set(idempotency.Header, key)
		slot.expect(key)
	}
	d.calls.Add(1)
	resp, err := d.client.Do(req)
	n, keyOK := slot.endCall()
	d.attempts.Add(int64(n))
	if !keyOK {
		d.keyErrors.Add(1)
	}
	if err != nil {
		d.gaveUp.Add(1)
		return unknown, err.Error()
	}
	defer resp.Body.Close()
	buf, _ := d.bufs.Get().(*bytes.Buffer)
	if buf == nil {
		buf = new(bytes.Buffer)
	}
	buf.Reset()
	defer d.bufs.Put(buf)
	if _, err := buf.ReadFrom(resp.Body); err != nil {
		return unknown, "reading the answer: " + err.Error()
	}
	data := buf.Bytes() // valid until the return: every message below copies what it shows
	if len(resp.Header[wire.GiveUpHeader]) > 0 {
		d.gaveUp.Add(1)
	}
	switch code := resp.StatusCode; {
	case code == http.StatusCreated:
		replay := resp.Header.Get(idempotency.ReplayHeader) == "true"
		if want, ok := d.ledger.Produced(id); !ok || sha256.Sum256(data) != want {
			what := "answer"
			if replay {
				what = "replay"
				d.badReplays.Add(1)
			} else {
				d.badAnswers.Add(1)
			}
			return rejected, fmt.Sprintf("201 %s of %d bytes (%.40q...) differs from what the handler produced for %s", what, len(data), data, id)
		}
		// The answer is the one the handler produced for id (same hash),
		// so it is that payment's JSON, which starts with its ID (the
		// first field of Payment): checked on those bytes, not by
		// decoding the whole answer (16 KiB of padding in hostile runs,
		// a tenth of the driver's CPU when decoded).
		if !bytes.HasPrefix(data, answerPrefix(id)) {
			return rejected, fmt.Sprintf("201 with body %.60q..., want payment %s", data, id)
		}
		if replay {
			d.replays.Add(1)
		}
		return succeeded, ""
	case code == http.StatusConflict:
		d.conflicts.Add(1)
		return busy, "409 in progress"
	case code >= 500:
		return unknown, fmt.Sprintf("%d %s", code, bytes.TrimSpace(data))
	default:
		return rejected, fmt.Sprintf("status %d, body %q", code, data)
	}
}

// answerPrefix returns how the handler's JSON answer for payment id
// starts: {"payment":"pay-000042",
func answerPrefix(id string) []byte {
	q, _ := json.Marshal(id) // cannot fail: a string
	return append(append([]byte(`{"payment":`), q...), ',')
}

// slotKey is the context key of a *keySlot.
type slotKey struct{}

// keySlot records the Idempotency-Key of the attempts of one payment's
// calls, as keyTap sees them on the wire.
type keySlot struct {
	mu       sync.Mutex
	key      string // the payment's key: the first one seen or expected
	callKey  string // the key of the current call's first attempt
	attempts int    // attempts of the current call
	bad      bool   // an attempt of the current call had another key or none
}

// get returns the payment's key, "" if none was sent yet.
func (s *keySlot) get() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.key
}

// expect sets the key the next call must send on every attempt.
func (s *keySlot) expect(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.key, s.callKey = key, key
}

// observe records one attempt's key.
func (s *keySlot) observe(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.attempts++
	switch {
	case key == "":
		s.bad = true
	case s.callKey == "":
		s.callKey = key
		if s.key == "" {
			s.key = key
		} else if s.key != key {
			s.bad = true
		}
	case s.callKey != key:
		s.bad = true
	}
}

// endCall returns the current call's attempts and whether they all carried
// the right key, and resets the per-call state.
func (s *keySlot) endCall() (attempts int, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	attempts, ok = s.attempts, !s.bad
	s.attempts, s.bad, s.callKey = 0, false, ""
	return attempts, ok
}

// keyTap is the base transport under the retrying one: it reports the key
// of each attempt to the request context's keySlot and, unless resend is
// set, keeps net/http from resending the attempt on its own.
type keyTap struct {
	base   http.RoundTripper
	resend bool
}

func (k keyTap) RoundTrip(r *http.Request) (*http.Response, error) {
	if !k.resend && r.GetBody != nil {
		// net/http resends a request after a failure on a reused
		// connection only if it can rewind the body (GetBody).
		r2 := *r
		r2.GetBody = nil
		r = &r2
	}
	if s, ok := r.Context().Value(slotKey{}).(*keySlot); ok {
		var key string
		if vs := r.Header[idempotency.Header]; len(vs) == 1 {
			key = vs[0]
		}
		s.observe(key)
	}
	return k.base.RoundTrip(r)
}

// timeoutMessage is the body of the 503 the timeout handler answers.
const timeoutMessage = "idemtest: handler timeout"

// timeoutTap counts in n the requests h (an http.TimeoutHandler) answers
// with its own 503.
func timeoutTap(h http.Handler, n *atomic.Int64) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(&statusTap{ResponseWriter: w, n: n}, r)
	})
}

// statusTap counts the timeout handler's own answer.
type statusTap struct {
	http.ResponseWriter
	status int
	n      *atomic.Int64
}

func (s *statusTap) WriteHeader(code int) {
	if s.status == 0 {
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusTap) Write(p []byte) (int, error) {
	if s.status == http.StatusServiceUnavailable && string(p) == timeoutMessage {
		s.n.Add(1)
	}
	return s.ResponseWriter.Write(p)
}

// result returns what the run measured, from d's counts, the ledger's,
// the proxy's stats and the run's elapsed time.
func (d *driver) result(stats ProxyStats, elapsed time.Duration) *Result {
	cfg := d.cfg
	res := &Result{
		Payments:      cfg.Payments,
		Servers:       len(cfg.Stores),
		Failed:        int(d.failed.Load()),
		Calls:         d.calls.Load(),
		Attempts:      d.attempts.Load(),
		Redrives:      d.redrives.Load(),
		GaveUp:        d.gaveUp.Load(),
		Conflicts:     d.conflicts.Load(),
		LongestBusy:   time.Duration(d.longestBusy.Load()),
		Replays:       d.replays.Load(),
		BadReplays:    d.badReplays.Load(),
		BadAnswers:    d.badAnswers.Load(),
		KeyErrors:     d.keyErrors.Load(),
		Proxy:         stats,
		Elapsed:       elapsed,
		Errors:        d.errs,
		ResetRate:     cfg.ResetRate,
		DropRate:      cfg.DropRate,
		CutRate:       cfg.CutRate,
		Timeout:       cfg.Timeout,
		SlowRate:      cfg.Handler.SlowRate,
		StoreBlipRate: cfg.StoreBlipRate,
	}
	res.Aborted, res.Overran = d.ledger.Slow()
	res.Applied, res.Duplicates, res.Lost, res.Unknown = d.ledger.Tally(cfg.Payments)
	_, res.RunsByServer = d.ledger.Snapshot()
	seen := make(map[string]bool, len(d.keys))
	for _, k := range d.keys {
		if k == "" {
			continue
		}
		if seen[k] {
			res.KeyCollisions++
		}
		seen[k] = true
	}
	return res
}
