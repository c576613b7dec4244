package redisstore_test

import (
	"bytes"
	"context"
	"fmt"
	"log"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"
)

// go-redis logs every dial it gives up on to stderr, through one logger for
// the whole process, from its pools' own goroutines. Some tests refuse
// dials on purpose (clients of 127.0.0.1:1, where nothing listens; the
// cluster tests kill the redis-servers they started), and those lines read
// like failures in the test output. The test binary's go-redis logger drops
// the refused dials to the addresses registered with expectRefusedDials and
// prints every other line as go-redis would. (The fleet module's tests do
// the same.)
func init() {
	expectRefusedDials("127.0.0.1:1")
	redis.SetLogger(quietRefusals{log.New(os.Stderr, "redis: ", log.LstdFlags)})
}

// refusing holds the addresses whose refused dials are expected.
var refusing sync.Map // string -> struct{}

// expectRefusedDials registers addr (host:port) as one whose refused dials
// a test expects; it stays registered until the test binary ends, since a
// pool may log after the test that made it.
func expectRefusedDials(addr string) { refusing.Store(addr, struct{}{}) }

// quietRefusals is a go-redis logger that drops the lines of refused dials
// to the registered addresses.
type quietRefusals struct{ next *log.Logger }

func (q quietRefusals) Printf(_ context.Context, format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	if strings.Contains(msg, "connection refused") {
		quiet := false
		refusing.Range(func(addr, _ any) bool {
			quiet = strings.Contains(msg, "dial tcp "+addr.(string)+":")
			return !quiet
		})
		if quiet {
			return
		}
	}
	q.next.Print(msg)
}

func TestQuietRefusals(t *testing.T) {
	var buf bytes.Buffer
	q := quietRefusals{log.New(&buf, "", 0)}
	const format = "redis: connection pool: failed to dial after %d attempts: %v"
	q.Printf(context.Background(), format, 5, "dial tcp 127.0.0.1:1: connect: connection refused")
	q.Printf(context.Background(), format, 5, "dial tcp 127.0.0.1:12: connect: connection refused")
	q.Printf(context.Background(), format, 5, "dial tcp 127.0.0.1:1: i/o timeout")
	want := "redis: connection pool: failed to dial after 5 attempts: dial tcp 127.0.0.1:12: connect: connection refused\n" +
		"redis: connection pool: failed to dial after 5 attempts: dial tcp 127.0.0.1:1: i/o timeout\n"
	if got := buf.String(); got != want {
		t.Errorf("quietRefusals printed:\n%s\nwant (only the refused dial to 127.0.0.1:1 dropped):\n%s", got, want)
	}
}
