package idemtest

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"hash/fnv"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Payment is the JSON body of a payment request and of the handler's
// answer.
type Payment struct {
	// ID names the logical payment, e.g. "pay-000042".
	ID string `json:"payment"`
	// AmountCents is the amount, in cents.
	AmountCents int64 `json:"amount_cents"`
	// Applied is, in an answer, how many times the ledger has applied the
	// payment, this time included: 1 unless something is broken. Ignored
	// in requests.
	Applied int `json:"applied,omitempty"`
	// Server is, in an answer, the name of the server whose handler ran.
	Server string `json:"server,omitempty"`
	// Pad is, in an answer, filler that makes the answer as long as
	// [HandlerConfig.AnswerBytes] asks. Ignored in requests.
	Pad string `json:"pad,omitempty"`
}

// Ledger is the payments handlers' own record of what they applied and
// what they answered: the ground truth the end-to-end verdict is computed
// from, independent of the idempotency store. The zero Ledger is empty and
// ready to use; it is safe for concurrent use and may be shared by many
// handlers (servers).
type Ledger struct {
	mu sync.Mutex
	// Fields below are guarded by mu.
	applied  map[string]int      // payment ID -> times applied
	byServer map[string]int      // server name -> handler runs
	starts   map[string]int      // payment ID -> handler runs started
	produced map[string][32]byte // payment ID -> SHA-256 of the last answer produced
	aborted  int                 // runs that gave up before applying
	overran  int                 // runs that applied and ended after their request's deadline
}

// Apply records one application of payment id by server and returns how
// many times id has now been applied.
func (l *Ledger) Apply(id, server string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.init()
	l.applied[id]++
	l.byServer[server]++
	return l.applied[id]
}

// init makes the maps; it requires l.mu held.
func (l *Ledger) init() {
	if l.applied == nil {
		l.applied = make(map[string]int)
		l.byServer = make(map[string]int)
		l.starts = make(map[string]int)
		l.produced = make(map[string][32]byte)
	}
}

// Times returns how many times payment id was applied; 0 if never.
func (l *Ledger) Times(id string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.applied[id]
}

// Produced returns the SHA-256 hash of the last answer body a handler
// produced for payment id (whole, whatever reached the client), and
// whether one did.
func (l *Ledger) Produced(id string) ([32]byte, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	h, ok := l.produced[id]
	return h, ok
}

// Snapshot returns copies of the ledger's counts: times applied per
// payment ID, and handler runs per server name.
func (l *Ledger) Snapshot() (applied, byServer map[string]int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	applied = make(map[string]int, len(l.applied))
	for k, v := range l.applied {
		applied[k] = v
	}
	byServer = make(map[string]int, len(l.byServer))
	for k, v := range l.byServer {
		byServer[k] = v
	}
	return applied, byServer
}

// Tally returns the ledger's verdict on payments 0 to n-1 (see
// [PaymentID]): how many were applied at least once, the extra
// applications (the sum over payments of times applied - 1), how many
// were never applied, and how many ledger entries are for payments
// outside them.
func (l *Ledger) Tally(n int) (applied, duplicates, lost, unknown int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i := range n {
		switch k := l.applied[PaymentID(i)]; k {
		case 0:
			lost++
		default:
			applied++
			duplicates += k - 1
		}
	}
	return applied, duplicates, lost, len(l.applied) - applied
}

// Slow returns the number of handler runs that gave up without a word
// because their request was canceled before they applied the payment
// (aborted), and of runs that applied it and ended after their request's
// deadline (overran: an [http.TimeoutHandler] answered for most of them).
func (l *Ledger) Slow() (aborted, overran int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.aborted, l.overran
}

// start counts a new handler run for payment id and returns its number,
// from 1.
func (l *Ledger) start(id string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.init()
	l.starts[id]++
	return l.starts[id]
}

// Answered records body as the answer a handler produced for payment id
// (whole, whatever reaches the client), for [Ledger.Produced]. The
// payments handler calls it before it writes its answer; a handler of
// another protocol calls it with its own answer's bytes.
func (l *Ledger) Answered(id string, body []byte) {
	sum := sha256.Sum256(body)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.init()
	l.produced[id] = sum
}

func (l *Ledger) count(aborted, overran bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if aborted {
		l.aborted++
	}
	if overran {
		l.overran++
	}
}

// maxPaymentBody caps the request body the payments handler reads, in
// bytes.
const maxPaymentBody = 4 << 10

// HandlerConfig shapes the answers of a payments handler. The zero value
// is a fast handler that writes a small answer at once.
type HandlerConfig struct {
	// AnswerBytes pads every answer to about this many bytes; 0 means no
	// padding.
	AnswerBytes int
	// Chunks is the number of parts the answer is written in, each
	// flushed; 0 or 1 means one write. A handler stops writing at the
	// first write error, as streaming handlers do.
	Chunks int
	// SlowRate is the fraction of handler runs, from 0 to 1, that are
	// slow, chosen by a hash of the payment ID and the run's number for
	// that payment, so the choice is reproducible and a retry may be fast.
	// Half of the slow runs wait Pause before applying the payment and
	// give up without a word if their request is canceled meanwhile; the
	// other half wait Pause in all while they write the answer, in equal
	// parts before each chunk after the first (Pause/(Chunks-1) each),
	// whatever happens to the request (the payment is applied: the answer
	// must be finished). A Pause in all, not one per chunk: it already
	// overruns a timeout shorter than Pause, and a run that lasted Pause
	// per chunk kept its key locked that many times longer, each
	// re-drive meanwhile one more 409 round trip (five times the 409s,
	// a sixth more attempts in hostile runs, for no other fault).
	SlowRate float64
	// Pause is the wait of a slow run.
	Pause time.Duration
}

// Handler returns the payments handler of the server named server with
// the zero [HandlerConfig]: see [Ledger.HandlerWith].
func (l *Ledger) Handler(server string) http.Handler {
	return l.HandlerWith(server, HandlerConfig{})
}

// HandlerWith returns the payments handler of the server named server: it
// reads a JSON [Payment], applies it to l, and answers 201 Created with the
// payment, the application count and the server name as JSON, shaped by
// cfg, recording the answer's hash ([Ledger.Produced]) before writing it.
// A body that is not a payment with an ID gets 400. The handler is safe for
// concurrent use.
func (l *Ledger) HandlerWith(server string, cfg HandlerConfig) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var p Payment
		data, err := io.ReadAll(io.LimitReader(r.Body, maxPaymentBody))
		if err == nil {
			err = json.Unmarshal(data, &p)
		}
		if err != nil || p.ID == "" {
			http.Error(w, "want a JSON payment with an ID", http.StatusBadRequest)
			return
		}
		slowBefore, slowDuring := cfg.slow(p.ID, l.start(p.ID))
		ctx := r.Context()
		if slowBefore {
			t := time.NewTimer(cfg.Pause)
			select {
			case <-ctx.Done():
				t.Stop()
				l.count(true, false)
				return // gives up without a word: nothing applied
			case <-t.C:
			}
		}
		p.Applied = l.Apply(p.ID, server)
		defer func() { l.count(false, ctx.Err() == context.DeadlineExceeded) }()
		p.Server = server
		out, _ := json.Marshal(p) // cannot fail: strings and integers
		if pad := cfg.AnswerBytes - len(out); pad > 0 {
			p.Pad = strings.Repeat("~", pad)
			out, _ = json.Marshal(p)
		}
		l.Answered(p.ID, out)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/payments/"+p.ID)
		w.WriteHeader(http.StatusCreated)
		size := (len(out) + max(cfg.Chunks, 1) - 1) / max(cfg.Chunks, 1)
		rc := http.NewResponseController(w)
		part := cfg.Pause / time.Duration(max(cfg.Chunks-1, 1))
		for i := 0; i < len(out); i += size {
			if i > 0 && slowDuring {
				time.Sleep(part)
			}
			if _, err := w.Write(out[i:min(i+size, len(out))]); err != nil {
				return
			}
			_ = rc.Flush() // not every writer can (http.TimeoutHandler's cannot)
		}
	})
}

// slow reports whether run n of payment id waits before applying it, or
// between the chunks of its answer.
func (cfg HandlerConfig) slow(id string, n int) (before, during bool) {
	if cfg.SlowRate <= 0 {
		return false, false
	}
	h := fnv.New64a()
	h.Write([]byte(id))
	h.Write([]byte{0})
	h.Write([]byte(strconv.Itoa(n)))
	x := float64(h.Sum64()>>11) / (1 << 53)
	switch {
	case x < cfg.SlowRate/2:
		return true, false
	case x < cfg.SlowRate:
		return false, true
	}
	return false, false
}
