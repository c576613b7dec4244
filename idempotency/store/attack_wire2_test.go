// Black-box attacks (AREA wire2) on the record encoding against its docs.

package store_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"runtime"
	"strings"
	"testing"

	"github.com/stormguard/stormguard/idempotency/store"
)

func wire2Alloc(f func()) uint64 {
	var m0, m1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m0)
	f()
	runtime.ReadMemStats(&m1)
	return m1.TotalAlloc - m0.TotalAlloc
}

// wire2CorruptMany builds a record whose header holds one field with
// nvals empty values, followed by garbage instead of a body length: every
// length is within the bytes left, the record is corrupt only at its end.
func wire2CorruptManyValues(nvals int) []byte {
	b := []byte("SGR\x01\x00\xc8")
	b = binary.AppendUvarint(b, 1)
	b = binary.AppendUvarint(b, 1)
	b = append(b, 'A')
	b = binary.AppendUvarint(b, uint64(nvals))
	b = append(b, make([]byte, nvals)...) // nvals empty values, 1 byte each
	b = append(b, 0xff)                   // bad body length (truncated varint)
	return b
}

func wire2CorruptManyFields(nfields int) []byte {
	b := []byte("SGR\x01\x00\xc8")
	b = binary.AppendUvarint(b, uint64(nfields))
	for i := 0; i < nfields; i++ {
		name := fmt.Sprintf("%x", i)
		b = binary.AppendUvarint(b, uint64(len(name)))
		b = append(b, name...)
		b = append(b, 0) // no values
	}
	b = append(b, 0xff)
	return b
}

// DOC (record.go, DecodeRecord): "Every length is checked against the bytes
// left, so garbage gives an error saying the record is corrupt, never a
// panic or an outsized allocation." The package's own test
// (TestDecodeRecordCorruptCountsCostTheirInput) takes 8x the input as the
// bound on what a corrupt record may cost.
func TestAttackWire2CorruptRecordAllocationBounded(t *testing.T) {
	for _, tc := range []struct {
		name string
		data []byte
	}{
		{"one field, 1M empty values", wire2CorruptManyValues(1 << 20)},
		{"256k fields without values", wire2CorruptManyFields(1 << 18)},
	} {
		var err error
		got := wire2Alloc(func() { _, err = store.DecodeRecord(tc.data) })
		if err == nil {
			t.Fatalf("%s: corrupt record decoded", tc.name)
		}
		if got > 8*uint64(len(tc.data)) {
			t.Errorf("%s: DecodeRecord of %d corrupt bytes allocated %d bytes (%.1fx the input; bound 8x)", tc.name, len(tc.data), got, float64(got)/float64(len(tc.data)))
		}
	}
}

// A record claiming a huge length in each position costs next to nothing.
func TestAttackWire2HugeClaimedLengths(t *testing.T) {
	base := []byte("SGR\x01\x00\xc8")
	huge := binary.AppendUvarint(nil, 1<<62)
	for _, data := range [][]byte{
		append(append(bytes.Clone(base), huge...), 0, 0, 0),                                                    // header count
		append(append(append(bytes.Clone(base), 1), huge...), 'a', 0, 0),                                       // name length
		append(append(append(bytes.Clone(base), 1, 1, 'A'), huge...), 0, 0),                                    // value count
		append(append(append(bytes.Clone(base), 1, 1, 'A', 1), huge...), 0, 0),                                 // value length
		append(append(append(bytes.Clone(base), 0), huge...), 'x', 'y'),                                        // body length
		append(append(bytes.Clone(base), 0), 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01), // overflowing varint
	} {
		var err error
		got := wire2Alloc(func() { _, err = store.DecodeRecord(data) })
		if err == nil || !strings.Contains(err.Error(), "corrupt record") {
			t.Errorf("DecodeRecord(%x) err = %v, want a corrupt-record error", data, err)
		}
		if got > 64<<10 { // a claimed 2^62 bytes allocate nothing like it (the bound leaves room for the runtime's own)
			t.Errorf("DecodeRecord(%x) allocated %d bytes", data, got)
		}
	}
}

// Every truncation and every single-byte corruption of a valid record
// gives a corrupt-record error or a record, never a panic; all errors
// share one sentinel (errors.Is against the first one's unwrap).
func TestAttackWire2TruncateAndFlip(t *testing.T) {
	rec := store.Record{Status: 503, Header: http.Header{"Content-Type": {"text/plain"}, "Retry-After": {"3", ""}, "X-\xff": {"\x00\r\n"}}, Body: []byte("hello\x00world"), BodyOmitted: false}
	b, err := rec.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	_, e0 := store.DecodeRecord(b[:3])
	sentinel := errors.Unwrap(e0)
	if sentinel == nil {
		t.Fatalf("error %v wraps nothing", e0)
	}
	for i := 0; i < len(b); i++ {
		if _, err := store.DecodeRecord(b[:i]); err == nil || !errors.Is(err, sentinel) {
			t.Errorf("truncated to %d: err %v", i, err)
		}
		for _, x := range []byte{0x01, 0x80, 0xff} {
			c := bytes.Clone(b)
			c[i] ^= x
			if _, err := store.DecodeRecord(c); err != nil && !errors.Is(err, sentinel) {
				t.Errorf("flip %d^%x: err %v not the corrupt sentinel", i, x, err)
			}
		}
	}
	got, err := store.DecodeRecord(b)
	if err != nil || got.Status != 503 || string(got.Body) != "hello\x00world" || len(got.Header) != 3 || got.Header["Retry-After"][1] != "" || got.Header["X-\xff"][0] != "\x00\r\n" {
		t.Errorf("round trip: %+v, %v", got, err)
	}
	om := store.Record{Status: 999, BodyOmitted: true, Header: http.Header{"A": {"b"}}}
	b, _ = om.MarshalBinary()
	if got, err := store.DecodeRecord(b); err != nil || !got.BodyOmitted || got.Status != 999 || got.Header.Get("A") != "b" || len(got.Body) != 0 {
		t.Errorf("omitted round trip: %+v, %v", got, err)
	}
}
