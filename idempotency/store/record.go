package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"slices"

	"github.com/stormguard/stormguard/internal/recordcheck"
)

// errCorrupt is wrapped by every error [DecodeRecord] returns.
var errCorrupt = errors.New("idempotency: corrupt record")

// Record is a stored response: what a replay sends back.
type Record struct {
	// Status is the HTTP status code, 200 to 999 (net/http's range; 1xx
	// informational responses are never stored). A protocol without HTTP
	// statuses maps its own into that range (grpcretry stores gRPC code c
	// as 900+c).
	Status int
	// Header holds the allow-listed response header fields; nil means none.
	Header http.Header
	// Body is the response body; nil means empty.
	Body []byte
	// BodyOmitted reports that the handler's body was not kept (over the
	// size cap, or no room in the store): Body is empty and a replay says
	// so (the HTTP middleware with the header Idempotent-Body-Omitted).
	BodyOmitted bool
}

// Record encoding (all integers unsigned varints unless noted):
//
//	"SGR" version                 magic; version 1, or 2 when a flag is set
//	status                        2 bytes, big endian
//	flags                         version 2 only: 1 byte, at least one bit
//	                              set; bit 0: body omitted (the body is
//	                              then empty); other bits 0
//	number of header fields n
//	n times: len, name bytes, number of values m, m times: len, value bytes
//	len, body bytes
//
// Header names are written sorted and varints in their shortest form, so
// equal records encode equally, and a record without flags is written as
// version 1, which readers of version 1 understand. Nothing may follow the
// body.
const recordMagic = "SGR"

// Record encoding versions and flags.
const (
	recordV1        = 1
	recordV2        = 2
	flagBodyOmitted = 1 << 0
)

// recordMinLen is the length of the shortest valid encoding.
const recordMinLen = len(recordMagic) + 1 + 2 + 1 + 1

// MarshalBinary encodes r in the versioned binary form [DecodeRecord]
// reads. It fails only when Status is outside 200-999, a record with
// BodyOmitted has a body, or a header field has an empty name. Equal records (nil and empty header or body being equal) encode to
// equal bytes, so a store may compare records by their encodings.
func (r Record) MarshalBinary() ([]byte, error) {
	if err := r.check(); err != nil {
		return nil, fmt.Errorf("idempotency: encode record: %w", err)
	}
	b := make([]byte, 0, r.encodedLen())
	b = append(b, recordMagic...)
	if r.BodyOmitted {
		b = append(b, recordV2)
		b = binary.BigEndian.AppendUint16(b, uint16(r.Status))
		b = append(b, flagBodyOmitted)
	} else {
		b = append(b, recordV1)
		b = binary.BigEndian.AppendUint16(b, uint16(r.Status))
	}
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

// size returns an estimate of the memory r holds, in bytes: body, header
// names and values.
func (r Record) size() int {
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
	return recordMinLen + 1 + r.size() + 2*binary.MaxVarintLen64
}

// check reports what makes r unstorable, if anything.
func (r Record) check() error {
	return recordcheck.Check(r.Status, r.BodyOmitted, len(r.Body), r.Header)
}

func appendBytes[T string | []byte](b []byte, s T) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// DecodeRecord decodes a record encoded by [Record.MarshalBinary]. Every
// length is checked against the bytes left, so garbage gives an error
// saying the record is corrupt, never a panic or an outsized allocation.
// The returned record does not alias data.
func DecodeRecord(data []byte) (Record, error) {
	d := decoder{data: data}
	if len(data) < recordMinLen || string(data[:len(recordMagic)]) != recordMagic {
		return Record{}, fmt.Errorf("%w: not a record (bad magic or too short: %d bytes)", errCorrupt, len(data))
	}
	version := data[len(recordMagic)]
	if version != recordV1 && version != recordV2 {
		return Record{}, fmt.Errorf("%w: unsupported version %d", errCorrupt, version)
	}
	d.off = len(recordMagic) + 1
	status := int(binary.BigEndian.Uint16(data[d.off:]))
	d.off += 2
	if status < 200 || status > 999 {
		return Record{}, fmt.Errorf("%w: status %d outside 200-999", errCorrupt, status)
	}
	rec := Record{Status: status}
	if version == recordV2 {
		flags := data[d.off]
		d.off++
		if flags == 0 || flags&^flagBodyOmitted != 0 {
			return Record{}, fmt.Errorf("%w: flags 0x%02x (want some, and only known ones)", errCorrupt, flags)
		}
		rec.BodyOmitted = flags&flagBodyOmitted != 0
	}
	// The header fields and the body, walked once without a copy: a
	// corrupt record is refused before anything is allocated for it (a
	// field of a million empty values would otherwise cost a hundred times
	// its bytes before its bad end was found).
	if err := (&decoder{data: data, off: d.off}).check(); err != nil {
		return Record{}, err
	}
	n, err := d.count("header count")
	if err != nil {
		return Record{}, err
	}
	if n > 0 {
		// Sized for a real header at most: a count is checked against the
		// bytes left only, and a corrupt one must not cost a map of that size
		// before the first bad field is found (the map grows as fields come).
		rec.Header = make(http.Header, min(n, 64))
	}
	for range n {
		name, err := d.bytes("header name")
		if err != nil {
			return Record{}, err
		}
		if len(name) == 0 {
			return Record{}, fmt.Errorf("%w: empty header name at offset %d", errCorrupt, d.off)
		}
		key := string(name)
		if _, dup := rec.Header[key]; dup {
			return Record{}, fmt.Errorf("%w: header %q repeated", errCorrupt, key)
		}
		m, err := d.count("value count")
		if err != nil {
			return Record{}, err
		}
		vs := make([]string, 0, m) // the record was checked whole: m values follow
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
		if rec.BodyOmitted {
			return Record{}, fmt.Errorf("%w: %d body bytes in a record whose body is omitted", errCorrupt, len(body))
		}
		rec.Body = slices.Clone(body)
	}
	if d.off != len(data) {
		return Record{}, fmt.Errorf("%w: %d trailing bytes", errCorrupt, len(data)-d.off)
	}
	return rec, nil
}

type decoder struct {
	data []byte
	off  int
}

// check walks the header fields and the body from d's offset to the end
// of the data, and returns the error the decoding would meet, if any,
// without allocating.
func (d *decoder) check() error {
	n, err := d.count("header count")
	if err != nil {
		return err
	}
	for range n {
		name, err := d.bytes("header name")
		if err != nil {
			return err
		}
		if len(name) == 0 {
			return fmt.Errorf("%w: empty header name at offset %d", errCorrupt, d.off)
		}
		m, err := d.count("value count")
		if err != nil {
			return err
		}
		for range m {
			if _, err := d.bytes("header value"); err != nil {
				return err
			}
		}
	}
	if _, err := d.bytes("body"); err != nil {
		return err
	}
	if d.off != len(d.data) {
		return fmt.Errorf("%w: %d trailing bytes", errCorrupt, len(d.data)-d.off)
	}
	return nil
}

func (d *decoder) uvarint(what, suffix string) (uint64, error) {
	v, n := binary.Uvarint(d.data[d.off:])
	if n <= 0 {
		return 0, fmt.Errorf("%w: bad %s%s at offset %d", errCorrupt, what, suffix, d.off)
	}
	var min [binary.MaxVarintLen64]byte
	if n != binary.PutUvarint(min[:], v) { // one encoding per value
		return 0, fmt.Errorf("%w: non-minimal %s%s at offset %d", errCorrupt, what, suffix, d.off)
	}
	d.off += n
	return v, nil
}

// count reads an element count; each element takes at least one byte, so a
// count above the bytes left is corrupt (this bounds allocations).
func (d *decoder) count(what string) (int, error) { return d.countOf(what, "") }

// countOf is count of the element named what+suffix (joined only in an
// error: a name built for every value cost an allocation each).
func (d *decoder) countOf(what, suffix string) (int, error) {
	v, err := d.uvarint(what, suffix)
	if err != nil {
		return 0, err
	}
	if v > uint64(len(d.data)-d.off) {
		return 0, fmt.Errorf("%w: %s%s %d exceeds the %d bytes left", errCorrupt, what, suffix, v, len(d.data)-d.off)
	}
	return int(v), nil
}

func (d *decoder) bytes(what string) ([]byte, error) {
	n, err := d.countOf(what, " length")
	if err != nil {
		return nil, err
	}
	b := d.data[d.off : d.off+n]
	d.off += n
	return b, nil
}
