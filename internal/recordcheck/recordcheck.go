// Package recordcheck holds the one rule of what makes an idempotency
// record storable, shared by package idempotency/store (its encoding), the
// memory store and the Guard (which must know before it tries to store).
package recordcheck

import (
	"fmt"
	"net/http"
)

// Check reports what makes a record with status, the BodyOmitted flag
// omitted, a body of body bytes and header unstorable, if anything: a
// status outside 200-999, a body beside BodyOmitted, a header field with
// an empty name (which the encoding cannot tell from corruption).
func Check(status int, omitted bool, body int, header http.Header) error {
	if status < 200 || status > 999 {
		return fmt.Errorf("status %d outside 200-999", status)
	}
	if omitted && body > 0 {
		return fmt.Errorf("a record with BodyOmitted has a body of %d bytes", body)
	}
	if _, ok := header[""]; ok {
		return fmt.Errorf("a header field with an empty name")
	}
	return nil
}
