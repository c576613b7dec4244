package idemtest

// The soak scenario's settings and the Guard's log it reads (RunFaults).

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"
)

func fltEnvF(k string, def float64) float64 {
	var v float64
	if _, err := fmt.Sscan(os.Getenv(k), &v); err != nil {
		return def
	}
	return v
}

type fltKeyIdx struct{}

// fltLog collects the Guards' log lines by the key index in the context.
type fltLog struct {
	mu    sync.Mutex
	by    map[int][]string
	start time.Time
}

func (z *fltLog) add(ctx context.Context, s string) {
	k, ok := ctx.Value(fltKeyIdx{}).(int)
	if !ok {
		return
	}
	z.mu.Lock()
	if z.start.IsZero() {
		z.start = time.Now()
	}
	z.by[k] = append(z.by[k], fmt.Sprintf("%8.3fs %s", time.Since(z.start).Seconds(), s))
	z.mu.Unlock()
}

type fltLogHandler struct {
	z    *fltLog
	name string
}

func (z *fltLog) with(name string) slog.Handler { return fltLogHandler{z, name} }

func (h fltLogHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h fltLogHandler) Handle(ctx context.Context, r slog.Record) error {
	s := h.name + ": " + r.Message
	r.Attrs(func(a slog.Attr) bool {
		if a.Key != "id" {
			s += " " + a.String()
		}
		return true
	})
	h.z.add(ctx, s)
	return nil
}
func (h fltLogHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h fltLogHandler) WithGroup(string) slog.Handler      { return h }
