//go:build plan9

package retry

// connErrnos is empty on Plan 9, whose errors are strings; timeouts,
// io.ErrUnexpectedEOF and the self-declaring interfaces still classify.
var connErrnos = [...]error{}
