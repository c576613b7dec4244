package redisstore

import (
	"bytes"
	"errors"
	"testing"

	"github.com/stormguard/stormguard/idempotency/store"
)

func FuzzDecodeEntry(f *testing.F) {
	rec, _ := store.Record{Status: 201, Body: []byte("ok")}.MarshalBinary()
	lock := append([]byte{entryVersion, statePending}, make([]byte, headerLen-2)...)
	done := append([]byte{entryVersion, stateCompleted}, make([]byte, headerLen-2)...)
	f.Add(lock)
	f.Add(append(done, rec...))
	f.Add([]byte("garbage"))
	f.Fuzz(func(t *testing.T, b []byte) {
		e, err := decodeEntry(b)
		if err != nil {
			if !errors.Is(err, errCorruptEntry) {
				t.Fatalf("decodeEntry(%x) error %v does not wrap errCorruptEntry", b, err)
			}
			return
		}
		if !bytes.Equal(e.owner[:], b[2:18]) || !bytes.Equal(e.fp[:], b[18:headerLen]) {
			t.Fatalf("decodeEntry(%x): owner/fingerprint not taken from their offsets", b)
		}
		if e.completed != (b[1] == stateCompleted) {
			t.Fatalf("decodeEntry(%x): completed = %v for state %q", b, e.completed, b[1])
		}
	})
}

func TestFullErrors(t *testing.T) {
	oom := redisError("OOM command not allowed when used memory > 'maxmemory'.")
	for _, tc := range []struct {
		err  error
		full bool
	}{
		{oom, true},
		{redisError("ERR syntax error"), false},
		{errors.New("dial tcp: connection refused"), false},
	} {
		err := full(tc.err)
		if got := errors.Is(err, store.ErrStoreFull); got != tc.full || !errors.Is(err, tc.err) {
			t.Errorf("full(%v) = %v: ErrStoreFull %v, want %v (and the error kept)", tc.err, err, got, tc.full)
		}
	}
}

// redisError is an error as Redis sends it.
type redisError string

func (e redisError) Error() string { return string(e) }
