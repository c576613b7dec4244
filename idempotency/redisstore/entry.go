package redisstore

import (
	"errors"
	"fmt"

	"github.com/stormguard/stormguard/idempotency/store"
)

// Entry layout (the Redis value):
//
//	byte 0      version (1)
//	byte 1      state: 'p' locked (in progress), 'c' completed
//	bytes 2-17  owner token
//	bytes 18-49 fingerprint
//	bytes 50-   the record (store.Record encoding), completed only
const (
	entryVersion   = 1
	statePending   = 'p'
	stateCompleted = 'c'
	headerLen      = 2 + len(store.Owner{}) + len(store.Fingerprint{})
)

type entry struct {
	completed bool
	owner     store.Owner
	fp        store.Fingerprint
	rec       store.Record
}

// errCorruptEntry is wrapped by decodeEntry's errors.
var errCorruptEntry = errors.New("redisstore: corrupt entry")

// decodeEntry parses a Redis value written by the store. It never panics.
func decodeEntry(b []byte) (entry, error) {
	if len(b) < headerLen {
		return entry{}, fmt.Errorf("%w: %d bytes, want at least %d", errCorruptEntry, len(b), headerLen)
	}
	if b[0] != entryVersion {
		return entry{}, fmt.Errorf("%w: version %d", errCorruptEntry, b[0])
	}
	var e entry
	copy(e.owner[:], b[2:18])
	copy(e.fp[:], b[18:headerLen])
	switch b[1] {
	case statePending:
		if len(b) != headerLen {
			return entry{}, fmt.Errorf("%w: %d trailing bytes after a lock", errCorruptEntry, len(b)-headerLen)
		}
		return e, nil
	case stateCompleted:
		rec, err := store.DecodeRecord(b[headerLen:])
		if err != nil {
			return entry{}, fmt.Errorf("%w: %w", errCorruptEntry, err)
		}
		e.completed = true
		e.rec = rec
		return e, nil
	}
	return entry{}, fmt.Errorf("%w: state %q", errCorruptEntry, b[1])
}
