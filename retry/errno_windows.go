//go:build windows

package retry

import "syscall"

// wsaeconnrefused is WSAECONNREFUSED, which package syscall does not name.
const wsaeconnrefused syscall.Errno = 10061

// connErrnos are the system errors of a connection that broke: the peer
// reset or aborted it, refused it, or it was closed under a writer. Windows
// reports the WSA codes; the POSIX names are kept for errors built by Go
// code.
var connErrnos = [...]error{
	syscall.WSAECONNRESET,
	syscall.WSAECONNABORTED,
	wsaeconnrefused,
	syscall.ERROR_BROKEN_PIPE,
	syscall.ECONNRESET,
	syscall.ECONNREFUSED,
	syscall.ECONNABORTED,
	syscall.EPIPE,
}
