// Black-box tests of the package against its documentation, from attacks
// on it from outside: each names the sentence it checks.

package store_test

import (
	"net/http"
	"testing"

	"github.com/stormguard/stormguard/idempotency/store"
)

// DecodeRecord must read back whatever MarshalBinary accepted: a black-box
// attack found MarshalBinary taking a header field with an empty name,
// which DecodeRecord refuses as corrupt. MarshalBinary now refuses it.
func TestAttackRecordRoundTripEmptyHeaderName(t *testing.T) {
	rec := store.Record{Status: 200, Header: http.Header{"": {"v"}}, Body: []byte("ok")}
	b, err := rec.MarshalBinary()
	if err == nil {
		got, derr := store.DecodeRecord(b)
		t.Errorf("MarshalBinary(%+v) = %q, nil; want an error (DecodeRecord reads %+v, %v)", rec, b, got, derr)
	}
}

func TestAttackRecordRoundTripEdge(t *testing.T) {
	recs := []store.Record{
		{Status: 200},
		{Status: 999, Header: http.Header{"A": nil}},
		{Status: 200, Header: http.Header{"A": {""}}},
		{Status: 200, Header: http.Header{"X": {"\x00\xff"}}, Body: make([]byte, 1<<20)},
		{Status: 204, BodyOmitted: true, Header: http.Header{"B": {"1", "2"}}},
	}
	for i, rec := range recs {
		b, err := rec.MarshalBinary()
		if err != nil {
			t.Fatalf("%d: %v", i, err)
		}
		got, err := store.DecodeRecord(b)
		if err != nil {
			t.Fatalf("%d: decode: %v", i, err)
		}
		b2, _ := got.MarshalBinary()
		if string(b) != string(b2) {
			t.Fatalf("%d: re-encoding differs", i)
		}
	}
	for _, bad := range []int{0, 199, 1000, -1, 65536 + 200} {
		if _, err := (store.Record{Status: bad}).MarshalBinary(); err == nil {
			t.Errorf("status %d accepted", bad)
		}
	}
}
