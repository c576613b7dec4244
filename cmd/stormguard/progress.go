package main

import (
	"time"

	"github.com/schollz/progressbar/v3"
)

// progress returns a callback that draws a progress bar on stderr for runs
// longer than a second. It draws nothing when stderr is not a terminal or
// with --quiet. The callback must not be called concurrently.
func (e *env) progress(quiet bool, what string) func(done, total int) {
	p := e.progressBar(quiet, what)
	if p == nil {
		return nil
	}
	return p.set
}

// progressBar returns the progress bar behind [env.progress], or nil when
// it draws nothing. Its methods may be called on nil, and must not be
// called concurrently.
func (e *env) progressBar(quiet bool, what string) *progress {
	if quiet || !e.stderrIsTerminal {
		return nil
	}
	return &progress{e: e, what: what, start: time.Now()}
}

// progress is a progress bar on stderr, drawn once the work has taken a
// second.
type progress struct {
	e     *env
	what  string
	start time.Time
	bar   *progressbar.ProgressBar
}

// set shows done of total.
func (p *progress) set(done, total int) {
	if p == nil {
		return
	}
	if p.bar == nil {
		if done >= total || time.Since(p.start) < time.Second {
			return // short runs get no bar
		}
		p.bar = progressbar.NewOptions(total,
			progressbar.OptionSetWriter(p.e.stderr),
			progressbar.OptionSetDescription(p.what),
			progressbar.OptionShowCount(),
			progressbar.OptionSetWidth(30),
			progressbar.OptionClearOnFinish(),
			progressbar.OptionThrottle(100*time.Millisecond),
		)
	}
	p.bar.Set(done)
	if done >= total {
		p.bar.Finish()
	}
}

// clear erases the bar, if one is drawn: work that stops early leaves no
// half bar behind.
func (p *progress) clear() {
	if p == nil || p.bar == nil || p.bar.IsFinished() {
		return
	}
	p.bar.Clear()
}
