package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/stormguard/stormguard/cmd/stormguard/internal/live"
)

// maxColumns is the width the demo's output fits in (but --wide's table).
const maxColumns = 100

// columns returns the width of s on a terminal: one column a rune (the
// demo prints no wide characters).
func columns(s string) int { return utf8.RuneCountInString(s) }

// clip shortens s to width columns, marking the cut with "…".
func clip(s string, width int) string {
	if columns(s) <= width {
		return s
	}
	r := []rune(s)
	return string(r[:max(width-1, 0)]) + "…"
}

// times formats a load ratio: "1.50x". The live page formats it the same
// way.
func times(x float64) string { return fmt.Sprintf("%.2fx", x) }

// percent formats a share with one decimal, "100%" only when it is all of
// them (99.96% is "99.9%", not "100.0%"). The live page formats it the
// same way.
func percent(x float64) string {
	if x == 1 {
		return "100%"
	}
	s := fmt.Sprintf("%.1f", 100*x)
	if s == "100.0" {
		s = "99.9"
	}
	return s + "%"
}

// headline returns the run's headline figures: the load on the provider
// during the outage per request offered, and the share served.
func headline(s live.Summary) string {
	return fmt.Sprintf("%s the load in the outage, %6s served", times(s.OutageAmplification), percent(s.Goodput))
}

// WriteText writes a headline line per run, the attempts per window as a
// sparkline per run, and with wide the table of every figure. Every line
// but the table's fits in maxColumns.
func (r *demoResult) WriteText(out io.Writer) error {
	w := &stickyWriter{w: out}
	if err := r.writeText(w); err != nil {
		return err
	}
	return w.err
}

// stickyWriter writes to w until a write fails, and then keeps that error
// (and writes nothing more): a text written with many Fprintf calls is
// checked once, at its end.
type stickyWriter struct {
	w   io.Writer
	err error
}

func (s *stickyWriter) Write(p []byte) (int, error) {
	if s.err != nil {
		return 0, s.err
	}
	n, err := s.w.Write(p)
	if err != nil {
		s.err = err
	}
	return n, err
}

// writeText is WriteText to a writer whose errors are read at the end.
func (r *demoResult) writeText(w io.Writer) error {
	num := len(fmt.Sprint(len(r.Runs)))
	figs := make([]string, len(r.Runs))
	nameWidth := 0
	for i, run := range r.Runs {
		figs[i] = headline(run.Summary)
		nameWidth = max(nameWidth, columns(run.Name))
	}
	for i, run := range r.Runs {
		// Names longer than the room left are cut (the table has them whole).
		room := max(maxColumns-num-2-columns(figs[i]), 8)
		width := min(nameWidth, room)
		name := clip(run.Name, width)
		fmt.Fprintf(w, "%*d %s%s %s\n", num, i+1, name, strings.Repeat(" ", width-columns(name)), figs[i])
	}
	fmt.Fprintln(w)
	r.writeSparklines(w, num)
	fmt.Fprintln(w)
	for _, line := range wrap("the load in the outage: attempts that reached the provider during the outage per request "+
		"the fleet offered in that time (1.00x: one attempt each); served: requests that ended in success. "+
		"--wide: every figure; --json: all of it; --chart FILE.png: the chart; --serve ADDR: watch the runs live.", maxColumns) {
		fmt.Fprintln(w, line)
	}
	if !r.wide {
		return nil
	}
	fmt.Fprintln(w)
	return r.writeTable(w)
}

// sparkLevels are the levels of a sparkline, from the least to the most; a
// window without attempts is blank.
var sparkLevels = []rune("▁▂▃▄▅▆▇█")

// writeSparklines draws the attempts per window of each run on one line,
// numbered as the headline (num digits), on one scale, with the outage
// marked under them.
func (r *demoResult) writeSparklines(w io.Writer, num int) {
	n := 0
	for _, run := range r.Runs {
		for i, win := range run.Windows {
			if win.Attempts > 0 {
				n = max(n, i+1)
			}
		}
	}
	width := maxColumns - num - 1
	k := max((n+width-1)/width, 1) // windows a column
	cols := (n + k - 1) / k
	sums := make([][]int64, len(r.Runs))
	var top int64
	for i, run := range r.Runs {
		sums[i] = make([]int64, cols)
		for j, win := range run.Windows[:min(n, len(run.Windows))] {
			sums[i][j/k] += win.Attempts
			top = max(top, sums[i][j/k])
		}
	}
	span := r.Config.Window * time.Duration(k)
	fmt.Fprintln(w, clip(fmt.Sprintf("attempts at the provider per %v, from 0s to %v (one scale, █ the peak: %d; blank: none)",
		fmtDuration(span), fmtDuration(span*time.Duration(cols)), top), maxColumns))
	for i := range r.Runs {
		var b strings.Builder
		for _, v := range sums[i] {
			switch {
			case v == 0:
				b.WriteRune(' ')
			default:
				// Levels 1..8 for 1..top: a single attempt shows.
				b.WriteRune(sparkLevels[min(int((v*int64(len(sparkLevels))-1)/top), len(sparkLevels)-1)])
			}
		}
		fmt.Fprintf(w, "%*d %s\n", num, i+1, strings.TrimRight(b.String(), " "))
	}
	// The outage: ━ under its columns.
	from, to := r.Config.FailAt, r.Config.FailAt+r.Config.FailFor
	var b strings.Builder
	for j := range cols {
		start, end := span*time.Duration(j), span*time.Duration(j+1)
		if start < to && end > from {
			b.WriteRune('━')
		} else {
			b.WriteRune('─')
		}
	}
	fmt.Fprintf(w, "%*s %s\n", num, "", b.String())
	fmt.Fprintf(w, "%*s %s\n", num, "", clip(fmt.Sprintf("━ the outage, %v to %v", fmtDuration(from), fmtDuration(to)), width))
}

// providerText says how much the demo's provider serves: its capacity
// (0: unlimited) and work per request (0: none).
func providerText(c demoConfig) string {
	switch {
	case c.Capacity == 0 && c.Work == 0:
		return "serves any number of requests at once, at once (no limit)"
	case c.Capacity == 0:
		return fmt.Sprintf("serves any number of requests at once, %v each (no limit)", c.Work)
	case c.Work == 0:
		return fmt.Sprintf("serves %d requests at once, at once (no limit on the rate)", c.Capacity)
	}
	return fmt.Sprintf("serves %d requests at once, %v each (%.0f req/s at most)", c.Capacity, c.Work, float64(c.Capacity)/c.Work.Seconds())
}

// timeoutText is how the demo's clients give up on an attempt.
func timeoutText(c demoConfig) string {
	if c.Timeout == 0 {
		return "left at its deadline"
	}
	return fmt.Sprintf("timed out at %v", c.Timeout)
}

// writeTable writes the scenario and the table of every figure.
func (r *demoResult) writeTable(w io.Writer) error {
	c := r.Config
	fmt.Fprintf(w, "live on loopback: %d clients x 1 request every %v (%.0f req/s offered) for %v;\n",
		c.Clients, c.Every, float64(c.Clients)/c.Every.Seconds(), c.Duration)
	fmt.Fprintf(w, "the provider %s, queues %d more (served even\n"+
		"after their client %s), sheds the rest with 503,\n", providerText(c), c.Queue, timeoutText(c))
	fmt.Fprintf(w, "and answers 503 to everything from %v to %v; attempts counted at the server per %v window;\n", c.FailAt, c.FailAt+c.FailFor, c.Window)
	fmt.Fprintf(w, "stormguard: default transport (3 attempts, full jitter, budget, breaker probing every %v),\n"+
		"one per client or one for the fleet; every request has a %v deadline\n\n", c.OpenFor, c.Deadline)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "client, provider\toffered\tattempts\tin outage / offered\tpeak per window\tgoodput\tstarted in outage: ok\tshed after\t")
	for _, run := range r.Runs {
		s := run.Summary
		outageOK := "-" // no request started in an outage of no length
		if s.OutageStarted > 0 {
			outageOK = fmt.Sprintf("%.1f%%", 100*s.OutageGoodput)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.2fx\t%d\t%.1f%%\t%s\t%d\t\n", run.Name, run.Stats.Offered, s.Attempts,
			s.OutageAmplification, s.Peak, 100*s.Goodput, outageOK, s.ShedAfter)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "\nin outage / offered: attempts that reached the provider during the outage per request the\n"+
		"fleet offered in that time; goodput: requests that ended in success; started in outage: ok:\n"+
		"the same for the requests started during the outage; shed after: attempts the provider shed\n"+
		"once the outage was over.\n")
	return err
}
