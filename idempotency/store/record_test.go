package store

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net/http"
	"reflect"
	"runtime"
	"testing"
)

func TestRecordRoundTrip(t *testing.T) {
	recs := []Record{
		{Status: 200},
		{Status: 999},
		{Status: 201, Header: http.Header{"Content-Type": {"application/json"}, "Vary": {"A", "B"}}, Body: []byte(`{"id":1}`)},
		{Status: 204, Header: http.Header{"Etag": {""}}, Body: bytes.Repeat([]byte{0, 0xff}, 70000)},
		{Status: 201, Header: http.Header{"Location": {"/payments/1"}}, BodyOmitted: true},
	}
	for i, rec := range recs {
		b, err := rec.MarshalBinary()
		if err != nil {
			t.Fatalf("record %d: MarshalBinary: %v", i, err)
		}
		got, err := DecodeRecord(b)
		if err != nil {
			t.Fatalf("record %d: DecodeRecord: %v", i, err)
		}
		if got.Status != rec.Status || got.BodyOmitted != rec.BodyOmitted || !bytes.Equal(got.Body, rec.Body) || (len(rec.Header) > 0 && !reflect.DeepEqual(got.Header, rec.Header)) || (len(rec.Header) == 0 && len(got.Header) != 0) {
			t.Fatalf("record %d: DecodeRecord(MarshalBinary(r)) = %+v, want %+v", i, got, rec)
		}
		// Deterministic: header order does not change the encoding.
		b2, _ := rec.MarshalBinary()
		if !bytes.Equal(b, b2) {
			t.Fatalf("record %d: two encodings differ", i)
		}
	}
}

func TestRecordMarshalBadStatus(t *testing.T) {
	for _, s := range []int{0, 100, 199, 1000, -1} {
		if _, err := (Record{Status: s}).MarshalBinary(); err == nil {
			t.Errorf("MarshalBinary(status %d) = nil error", s)
		}
	}
	if _, err := (Record{Status: 200, Body: []byte("x"), BodyOmitted: true}).MarshalBinary(); err == nil {
		t.Error("MarshalBinary(a body and BodyOmitted) = nil error")
	}
}

// TestRecordEncodingVersions: a record without flags is written as
// version 1 (read by every version), one whose body was omitted as version
// 2.
func TestRecordEncodingVersions(t *testing.T) {
	v1, _ := Record{Status: 201}.MarshalBinary()
	v2, _ := Record{Status: 201, BodyOmitted: true}.MarshalBinary()
	if string(v1) != "SGR\x01\x00\xc9\x00\x00" || string(v2) != "SGR\x02\x00\xc9\x01\x00\x00" {
		t.Fatalf("encodings %q and %q, want version 1 without flags, version 2 with flag 1", v1, v2)
	}
}

func TestDecodeRecordErrors(t *testing.T) {
	valid, _ := Record{Status: 200, Header: http.Header{"A": {"b"}}, Body: []byte("xyz")}.MarshalBinary()
	tests := map[string][]byte{
		"empty":           nil,
		"bad magic":       append([]byte("XYZ"), valid[3:]...),
		"bad version":     append([]byte("SGR\x02"), valid[4:]...),
		"truncated":       valid[:len(valid)-1],
		"trailing byte":   append(append([]byte{}, valid...), 0),
		"status 0":        {'S', 'G', 'R', 1, 0, 0, 0, 0},
		"status 1000":     {'S', 'G', 'R', 1, 0x03, 0xe8, 0, 0},
		"huge count":      {'S', 'G', 'R', 1, 0, 200, 0xff, 0xff, 0xff, 0xff, 0x0f, 0},
		"huge body":       {'S', 'G', 'R', 1, 0, 200, 0, 0xff, 0xff, 0xff, 0xff, 0x0f},
		"bad varint":      {'S', 'G', 'R', 1, 0, 200, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80},
		"empty name":      {'S', 'G', 'R', 1, 0, 200, 1, 0, 0, 0},
		"repeated header": {'S', 'G', 'R', 1, 0, 200, 2, 1, 'A', 0, 1, 'A', 0, 0},
		"long varint":     {'S', 'G', 'R', 1, 0, 200, 0x80, 0x00, 0},
		"v2 without flag": {'S', 'G', 'R', 2, 0, 200, 0, 0, 0},
		"v2 unknown flag": {'S', 'G', 'R', 2, 0, 200, 3, 0, 0},
		"omitted w/ body": {'S', 'G', 'R', 2, 0, 200, 1, 0, 1, 'x'},
		"version 3":       {'S', 'G', 'R', 3, 0, 200, 1, 0, 0},
	}
	for name, b := range tests {
		if _, err := DecodeRecord(b); !errors.Is(err, errCorrupt) {
			t.Errorf("DecodeRecord(%s) error = %v, want a corrupt-record error", name, err)
		}
	}
}

func TestDecodeRecordDoesNotAlias(t *testing.T) {
	b, _ := Record{Status: 200, Body: []byte("body")}.MarshalBinary()
	rec, _ := DecodeRecord(b)
	for i := range b {
		b[i] = 0
	}
	if string(rec.Body) != "body" {
		t.Fatalf("decoded body changed with its input: %q", rec.Body)
	}
}

func FuzzDecodeRecord(f *testing.F) {
	for _, rec := range []Record{
		{Status: 200},
		{Status: 201, Header: http.Header{"Content-Type": {"application/json"}, "Vary": {"A", "B"}}, Body: []byte(`{"id":1}`)},
	} {
		b, _ := rec.MarshalBinary()
		f.Add(b)
	}
	omitted, _ := Record{Status: 201, Header: http.Header{"Location": {"/x"}}, BodyOmitted: true}.MarshalBinary()
	f.Add(omitted)
	f.Add([]byte("SGR\x01"))
	f.Add([]byte("SGR\x02\x00\xc8\x01\x00\x00"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		rec, err := DecodeRecord(data)
		if err != nil {
			if !errors.Is(err, errCorrupt) {
				t.Fatalf("DecodeRecord error %v does not say the record is corrupt", err)
			}
			return
		}
		// Whatever decodes re-encodes to the same bytes (the encoding is
		// canonical: sorted names, no duplicates, nothing trailing) except
		// that header names may arrive in any order.
		b, err := rec.MarshalBinary()
		if err != nil {
			t.Fatalf("MarshalBinary(DecodeRecord(%x)): %v", data, err)
		}
		again, err := DecodeRecord(b)
		if err != nil || again.Status != rec.Status || !bytes.Equal(again.Body, rec.Body) || len(again.Header) != len(rec.Header) || again.BodyOmitted != rec.BodyOmitted {
			t.Fatalf("round trip of %x: %+v, %v; want %+v", data, again, err, rec)
		}
		if len(b) != len(data) {
			t.Fatalf("re-encoding of %x has %d bytes, want %d", data, len(b), len(data))
		}
	})
}

// TestDecodeRecordCorruptCountsCostTheirInput: a header count as large as
// the bytes left (which the length check lets through) costs an
// allocation of about the input's size, not of the count's: a corrupt
// record of 1 MiB cost 100 MB before the header map was sized to the
// count.
func TestDecodeRecordCorruptCountsCostTheirInput(t *testing.T) {
	const n = 1 << 20
	data := append(binary.AppendUvarint([]byte("SGR\x01\x00\xc8"), n), make([]byte, n)...) // n headers, the first with an empty name
	var m0, m1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m0)
	_, err := DecodeRecord(data)
	runtime.ReadMemStats(&m1)
	if err == nil {
		t.Fatal("corrupt record decoded")
	}
	if got := m1.TotalAlloc - m0.TotalAlloc; got > 8*uint64(len(data)) {
		t.Errorf("DecodeRecord of %d corrupt bytes allocated %d bytes", len(data), got)
	}
}
