package idempotency

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"slices"
)

// ErrCorruptRecord is wrapped by every error [DecodeRecord] returns.
var ErrCorruptRecord = errors.New("idempotency: corrupt record")

// Record is a stored response: what a replay sends back.
type Record struct {
	// Status is the HTTP status code, 200 to 999 (net/http's range; 1xx
	// informational responses are never stored).
	Status int
	// Header holds the allow-listed response header fields; nil means none.
	Header http.Header
	// Body is the response body; nil means empty.
	Body []byte
}

// Record encoding, version 1 (all integers unsigned varints unless noted):
//
//	"SGR" 0x01                    magic and version
//	status                        2 bytes, big endian
//	number of header fields n
//	n times: len, name bytes, number of values m, m times: len, value bytes
//	len, body bytes
//
// Header names are written sorted and varints in their shortest form, so
// equal records encode equally. Nothing may follow the body.
const recordMagic = "SGR\x01"

// recordMinLen is the length of the shortest valid encoding.
const recordMinLen = len(recordMagic) + 2 + 1 + 1

// MarshalBinary encodes r in the versioned binary form [DecodeRecord]
// reads. It fails only when Status is outside 200-999.
func (r Record) MarshalBinary() ([]byte, error) {
	return r.AppendBinary(make([]byte, 0, r.encodedLen()))
}

// AppendBinary appends the encoding of r (see [Record.MarshalBinary]) to b.
func (r Record) AppendBinary(b []byte) ([]byte, error) {
	if r.Status < 200 || r.Status > 999 {
		return b, fmt.Errorf("idempotency: encode record: status %d outside 200-999", r.Status)
	}
	b = append(b, recordMagic...)
	b = binary.BigEndian.AppendUint16(b, uint16(r.Status))
	names := make([]string, 0, len(r.Header))
	for name := range r.Header {
		names = append(names, name)
	}
	slices.Sort(names)
	b = binary.AppendUvarint(b, uint64(len(names)))
	for _, name := range names {
		b = appendBytes(b, name)
		vs := r.Header[name]
		b = binary.AppendUvarint(b, uint64(len(vs)))
		for _, v := range vs {
			b = appendBytes(b, v)
		}
	}
	b = appendBytes(b, r.Body)
	return b, nil
}

// Size returns an estimate of the memory r holds, in bytes: body, header
// names and values. Bounded stores account records by it.
func (r Record) Size() int {
	n := len(r.Body)
	for name, vs := range r.Header {
		n += len(name) + 16
		for _, v := range vs {
			n += len(v) + 16
		}
	}
	return n
}

func (r Record) encodedLen() int {
	return recordMinLen + r.Size() + 2*binary.MaxVarintLen64
}

func appendBytes[T string | []byte](b []byte, s T) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// DecodeRecord decodes a record encoded by [Record.MarshalBinary]. Every
// length is checked against the bytes left, so garbage gives an error
// wrapping [ErrCorruptRecord], never a panic or an outsized allocation. The
// returned record does not alias data.
func DecodeRecord(data []byte) (Record, error) {
	d := decoder{data: data}
	if len(data) < recordMinLen || string(data[:len(recordMagic)-1]) != recordMagic[:len(recordMagic)-1] {
		return Record{}, fmt.Errorf("%w: not a record (bad magic or too short: %d bytes)", ErrCorruptRecord, len(data))
	}
	if v := data[len(recordMagic)-1]; v != recordMagic[len(recordMagic)-1] {
		return Record{}, fmt.Errorf("%w: unsupported version %d", ErrCorruptRecord, v)
	}
	d.off = len(recordMagic)
	status := int(binary.BigEndian.Uint16(data[d.off:]))
	d.off += 2
	if status < 200 || status > 999 {
		return Record{}, fmt.Errorf("%w: status %d outside 200-999", ErrCorruptRecord, status)
	}
	rec := Record{Status: status}
	n, err := d.count("header count")
	if err != nil {
		return Record{}, err
	}
	if n > 0 {
		rec.Header = make(http.Header, n)
	}
	for range n {
		name, err := d.bytes("header name")
		if err != nil {
			return Record{}, err
		}
		if len(name) == 0 {
			return Record{}, fmt.Errorf("%w: empty header name at offset %d", ErrCorruptRecord, d.off)
		}
		key := string(name)
		if _, dup := rec.Header[key]; dup {
			return Record{}, fmt.Errorf("%w: header %q repeated", ErrCorruptRecord, key)
		}
		m, err := d.count("value count")
		if err != nil {
			return Record{}, err
		}
		vs := make([]string, 0, m)
		for range m {
			v, err := d.bytes("header value")
			if err != nil {
				return Record{}, err
			}
			vs = append(vs, string(v))
		}
		rec.Header[key] = vs
	}
	body, err := d.bytes("body")
	if err != nil {
		return Record{}, err
	}
	if len(body) > 0 {
		rec.Body = slices.Clone(body)
	}
	if d.off != len(data) {
		return Record{}, fmt.Errorf("%w: %d trailing bytes", ErrCorruptRecord, len(data)-d.off)
	}
	return rec, nil
}

type decoder struct {
	data []byte
	off  int
}

func (d *decoder) uvarint(what string) (uint64, error) {
	v, n := binary.Uvarint(d.data[d.off:])
	if n <= 0 {
		return 0, fmt.Errorf("%w: bad %s at offset %d", ErrCorruptRecord, what, d.off)
	}
	var min [binary.MaxVarintLen64]byte
	if n != binary.PutUvarint(min[:], v) { // one encoding per value
		return 0, fmt.Errorf("%w: non-minimal %s at offset %d", ErrCorruptRecord, what, d.off)
	}
	d.off += n
	return v, nil
}

// count reads an element count; each element takes at least one byte, so a
// count above the bytes left is corrupt (this bounds allocations).
func (d *decoder) count(what string) (int, error) {
	v, err := d.uvarint(what)
	if err != nil {
		return 0, err
	}
	if v > uint64(len(d.data)-d.off) {
		return 0, fmt.Errorf("%w: %s %d exceeds the %d bytes left", ErrCorruptRecord, what, v, len(d.data)-d.off)
	}
	return int(v), nil
}

func (d *decoder) bytes(what string) ([]byte, error) {
	n, err := d.count(what + " length")
	if err != nil {
		return nil, err
	}
	b := d.data[d.off : d.off+n]
	d.off += n
	return b, nil
}
