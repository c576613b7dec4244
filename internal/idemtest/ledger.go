package idemtest

import (
	"encoding/json"
	"io"
	"net/http"
	"sync"
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
}

// Ledger is the payments handlers' own record of what they applied: the
// ground truth the end-to-end verdict is computed from, independent of the
// idempotency store. The zero Ledger is empty and ready to use; it is safe
// for concurrent use and may be shared by many handlers (servers).
type Ledger struct {
	mu       sync.Mutex
	applied  map[string]int // payment ID -> times applied
	byServer map[string]int // server name -> handler runs
}

// Apply records one application of payment id by server and returns how
// many times id has now been applied.
func (l *Ledger) Apply(id, server string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.applied == nil {
		l.applied = make(map[string]int)
		l.byServer = make(map[string]int)
	}
	l.applied[id]++
	l.byServer[server]++
	return l.applied[id]
}

// Times returns how many times payment id was applied; 0 if never.
func (l *Ledger) Times(id string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.applied[id]
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

// maxPaymentBody caps the request body the payments handler reads, in
// bytes.
const maxPaymentBody = 4 << 10

// Handler returns the payments handler of the server named server: it
// reads a JSON [Payment], applies it to l, and answers 201 Created with the
// payment, the application count and the server name as JSON. A body that
// is not a payment with an ID gets 400. The handler is safe for concurrent
// use.
func (l *Ledger) Handler(server string) http.Handler {
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
		p.Applied = l.Apply(p.ID, server)
		p.Server = server
		out, _ := json.Marshal(p) // cannot fail: strings and integers
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/payments/"+p.ID)
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(out)
	})
}
