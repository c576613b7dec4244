//go:build !plan9 && !windows

package retry

import "syscall"

// connErrnos are the system errors of a connection that broke: the peer
// reset or aborted it, refused it, or it was closed under a writer.
var connErrnos = [...]error{
	syscall.ECONNRESET,
	syscall.ECONNREFUSED,
	syscall.ECONNABORTED,
	syscall.EPIPE,
}
