package pgstore

import (
	"errors"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stormguard/stormguard/idempotency/store"
)

func TestFullErrors(t *testing.T) {
	for _, tc := range []struct {
		err  error
		full bool
	}{
		{&pgconn.PgError{Code: "53100"}, true}, // disk_full
		{&pgconn.PgError{Code: "53200"}, true}, // out_of_memory
		{&pgconn.PgError{Code: "54000"}, true}, // program_limit_exceeded
		{&pgconn.PgError{Code: "40001"}, false},
		{errors.New("connection reset"), false},
	} {
		err := full(tc.err)
		if got := errors.Is(err, store.ErrStoreFull); got != tc.full || !errors.Is(err, tc.err) {
			t.Errorf("full(%v) = %v: ErrStoreFull %v, want %v (and the error kept)", tc.err, err, got, tc.full)
		}
	}
}
