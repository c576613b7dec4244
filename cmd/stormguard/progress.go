package main

import (
	"time"

	"github.com/schollz/progressbar/v3"
)

// progress returns a callback that draws a progress bar on stderr for runs
// longer than a second. It draws nothing when stderr is not a terminal or
// with --quiet. The callback must not be called concurrently.
func (e *env) progress(quiet bool, what string) func(done, total int) {
	if quiet || !e.stderrIsTerminal {
		return nil
	}
	start := time.Now()
	var bar *progressbar.ProgressBar
	return func(done, total int) {
		if bar == nil {
			if done >= total || time.Since(start) < time.Second {
				return // short runs get no bar
			}
			bar = progressbar.NewOptions(total,
				progressbar.OptionSetWriter(e.stderr),
				progressbar.OptionSetDescription(what),
				progressbar.OptionShowCount(),
				progressbar.OptionSetWidth(30),
				progressbar.OptionClearOnFinish(),
				progressbar.OptionThrottle(100*time.Millisecond),
			)
		}
		bar.Set(done)
		if done >= total {
			bar.Finish()
		}
	}
}
