// Package pgstore is a store of idempotency keys ([store.Store]) on
// PostgreSQL, through github.com/jackc/pgx/v5, for the middleware of
// package idempotency.
//
// Keys live in one table, created by [Store.Migrate] (run it once, e.g. at
// deploy time; it is idempotent). Each call is one SQL statement, so one
// round trip: [Store.Begin] is a single INSERT ... ON CONFLICT DO UPDATE
// that claims a new or expired key and returns the row as it stands,
// [Store.Complete], [Store.Extend] and [Store.Release] are guarded by the
// owner token and the lock expiry. A new request costs two round trips
// (Begin, Complete), plus one per lock renewal for a handler that runs
// longer than a third of the lock timeout; a replay costs one. Expired rows
// are treated as absent at once and deleted by [Store.DeleteExpired], which
// should run periodically.
//
// Time is the database's (statement_timestamp()): every lock and record
// expires by the one clock of the server, whatever the clocks of the
// application servers that share the table say.
//
// A statement executed twice (its first reply lost) is harmless: a claim
// that finds the caller's own owner token claims, and a completion that
// finds the caller's own identical record succeeds. A claim whose reply is
// lost (a timeout, a broken connection) returns its owner token with the
// error, so that the idempotency Guard releases it (see
// [store.Result.Owner]). Server errors that mean
// no room (disk full, out of memory, a value over a limit) wrap
// [store.ErrStoreFull].
//
// Usage:
//
//	pool, err := pgxpool.New(ctx, "postgres://...")
//	keys, err := pgstore.New(pool, pgstore.Config{Table: "idempotency_keys"})
//	err = keys.Migrate(ctx) // once, e.g. at deploy time
//	mw, err := idempotency.NewMiddleware(keys, idempotency.WithScope(tenantOf))
package pgstore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stormguard/stormguard/idempotency/store"
)

// db is what the store needs from PostgreSQL: a *pgxpool.Pool, or a
// stand-in in tests.
type db interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// defaultTable is the table name used when Config.Table is empty.
const defaultTable = "stormguard_idempotency"

// Config configures a [Store]. The zero value is usable.
type Config struct {
	// Table is the table's name, optionally schema-qualified
	// ("schema.table"); each part is 1 to 63 letters, digits or
	// underscores, not starting with a digit. Empty means
	// "stormguard_idempotency".
	Table string
}

// Store is a store of idempotency keys on PostgreSQL. It is safe for
// concurrent use, and many processes may share one table.
type Store struct {
	db db

	table, index                                 string // sanitized identifiers
	beginSQL, completeSQL, extendSQL, releaseSQL string
	deleteExpiredSQL, migrateSQL                 string
}

var _ store.Store = (*Store)(nil)

var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)

// New returns a store on pool. It fails when pool is nil or the table name
// is invalid. It does not touch the database; call [Store.Migrate] first.
func New(pool *pgxpool.Pool, cfg Config) (*Store, error) {
	if pool == nil {
		return nil, errors.New("pgstore: New: nil pool")
	}
	return newStore(pool, cfg)
}

// newStore returns a store on d.
func newStore(d db, cfg Config) (*Store, error) {
	if cfg.Table == "" {
		cfg.Table = defaultTable
	}
	parts := strings.Split(cfg.Table, ".")
	if len(parts) > 2 {
		return nil, fmt.Errorf("pgstore: New: table %q: at most schema.table", cfg.Table)
	}
	for _, p := range parts {
		if !identRE.MatchString(p) {
			return nil, fmt.Errorf("pgstore: New: table %q: %q is not a plain identifier", cfg.Table, p)
		}
	}
	name := parts[len(parts)-1]
	if max := 63 - len("_expires_idx"); len(name) > max {
		// Cut to fit PostgreSQL's 63 bytes, with a hash of the whole name
		// so that two long names with one prefix get two indexes (a plain
		// cut made the second table's IF NOT EXISTS find the first's).
		sum := sha256.Sum256([]byte(name))
		name = name[:max-9] + "_" + hex.EncodeToString(sum[:4])
	}
	t := pgx.Identifier(parts).Sanitize()
	s := &Store{db: d, table: t, index: pgx.Identifier{name + "_expires_idx"}.Sanitize()}
	// Rows: record NULL = locked (in progress) until expires_at; record set
	// = completed, kept until expires_at. Every statement reads the time
	// once, as statement_timestamp() (the same value throughout it).
	s.migrateSQL = `CREATE TABLE IF NOT EXISTS ` + t + ` (
	key         bytea PRIMARY KEY,
	fingerprint bytea NOT NULL,
	owner       bytea NOT NULL,
	record      bytea,
	expires_at  timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS ` + s.index + ` ON ` + t + ` (expires_at)`
	// $1 key (the ID), $2 fingerprint, $3 new owner, $4 lock TTL. An
	// expired row is replaced; a live one is returned unchanged (the no-op
	// update locks it and makes RETURNING give its latest version, which a
	// plain SELECT in the same statement could miss under concurrency).
	s.beginSQL = `INSERT INTO ` + t + ` AS t (key, fingerprint, owner, record, expires_at)
VALUES ($1, $2, $3, NULL, statement_timestamp() + $4::interval)
ON CONFLICT (key) DO UPDATE SET
	fingerprint = CASE WHEN t.expires_at <= statement_timestamp() THEN excluded.fingerprint ELSE t.fingerprint END,
	owner       = CASE WHEN t.expires_at <= statement_timestamp() THEN excluded.owner ELSE t.owner END,
	record      = CASE WHEN t.expires_at <= statement_timestamp() THEN NULL ELSE t.record END,
	expires_at  = CASE WHEN t.expires_at <= statement_timestamp() THEN excluded.expires_at ELSE t.expires_at END
RETURNING t.owner, t.fingerprint, t.record`
	// $1 key, $2 owner, $3 record, $4 retention. The owner's live lock, or
	// its own identical record (a resent completion).
	s.completeSQL = `UPDATE ` + t + ` SET record = $3, expires_at = statement_timestamp() + $4::interval
WHERE key = $1 AND owner = $2 AND expires_at > statement_timestamp() AND (record IS NULL OR record = $3)`
	// $1 key, $2 owner, $3 lock TTL.
	s.extendSQL = `UPDATE ` + t + ` SET expires_at = statement_timestamp() + $3::interval
WHERE key = $1 AND owner = $2 AND record IS NULL AND expires_at > statement_timestamp()`
	// $1 key, $2 owner.
	s.releaseSQL = `DELETE FROM ` + t + `
WHERE key = $1 AND owner = $2 AND record IS NULL AND expires_at > statement_timestamp()`
	s.deleteExpiredSQL = `DELETE FROM ` + t + ` WHERE expires_at <= statement_timestamp()`
	return s, nil
}

// Migrate creates the table and its expiry index if they do not exist.
func (s *Store) Migrate(ctx context.Context) error {
	if _, err := s.db.Exec(ctx, s.migrateSQL); err != nil {
		return fmt.Errorf("pgstore: migrate %s: %w", s.table, err)
	}
	return nil
}

// Begin implements [store.Store.Begin] in one statement. lockTTL must be
// at least 1 µs (PostgreSQL keeps time in whole microseconds).
func (s *Store) Begin(ctx context.Context, id store.ID, fp store.Fingerprint, lockTTL time.Duration) (store.Result, error) {
	if err := checkTTL("lock TTL", lockTTL); err != nil {
		return store.Result{}, fmt.Errorf("pgstore: begin: %w", err)
	}
	if err := ctx.Err(); err != nil { // nothing sent, no owner to report
		return store.Result{}, fmt.Errorf("pgstore: begin: %w", err)
	}
	owner := store.NewOwner()
	var gotOwner, gotFP, rec []byte
	err := s.db.QueryRow(ctx, s.beginSQL, id[:], fp[:], owner[:], ceilUS(lockTTL)).Scan(&gotOwner, &gotFP, &rec)
	if err != nil {
		return store.Result{Owner: lostClaim(err, owner)}, fmt.Errorf("pgstore: begin: %w", full(err))
	}
	if len(gotOwner) != len(owner) || len(gotFP) != len(fp) {
		// A row another writer cut or changed: not a request's lock or
		// record, and not a reused key either.
		return store.Result{}, fmt.Errorf("pgstore: begin: key %x: corrupt row: owner %d bytes, fingerprint %d bytes (want %d and %d)",
			id, len(gotOwner), len(gotFP), len(owner), len(fp))
	}
	switch {
	case string(gotOwner) == string(owner[:]):
		return store.Result{Outcome: store.Claimed, Owner: owner}, nil
	case string(gotFP) != string(fp[:]):
		return store.Result{Outcome: store.Mismatch}, nil
	case rec == nil:
		return store.Result{Outcome: store.InProgress}, nil
	}
	r, err := store.DecodeRecord(rec)
	if err != nil {
		return store.Result{}, fmt.Errorf("pgstore: begin: key %x: %w", id, err)
	}
	return store.Result{Outcome: store.Completed, Record: r}, nil
}

// lostClaim returns owner when err, the claim statement's error, leaves
// it unknown whether the claim was made: the statement may have been sent
// (the deadline of a statement in flight, a connection broken after it
// was written) and the server did not answer with an error of its own
// (then it did not run it). At a context's deadline pgx closes the
// connection and asks the server to cancel the statement, but one that
// had finished (its reply not yet read) or that the server reads only
// after the cancel (a stalled server) has made its claim. Nothing
// was sent when pgx says so (pgconn.SafeToRetry), when no connection
// could be made, or when the deadline passed while the pool was out of
// connections (a bare context.DeadlineExceeded: a statement's own is a
// pgconn timeout); the zero owner then. A bare context.Canceled may be
// either, and reports the owner.
func lostClaim(err error, owner store.Owner) store.Owner {
	var pe *pgconn.PgError
	var ce *pgconn.ConnectError
	switch {
	case pgconn.SafeToRetry(err), errors.As(err, &pe), errors.As(err, &ce),
		errors.Is(err, context.DeadlineExceeded) && !pgconn.Timeout(err):
		return store.Owner{}
	}
	return owner
}

// Complete implements [store.Store.Complete] in one statement. retention
// must be at least 1 µs.
func (s *Store) Complete(ctx context.Context, id store.ID, owner store.Owner, rec store.Record, retention time.Duration) error {
	if err := checkTTL("retention", retention); err != nil {
		return fmt.Errorf("pgstore: complete: %w", err)
	}
	b, err := rec.MarshalBinary()
	if err != nil {
		return fmt.Errorf("pgstore: complete: %w", err)
	}
	tag, err := s.db.Exec(ctx, s.completeSQL, id[:], owner[:], b, retention)
	if err != nil {
		return fmt.Errorf("pgstore: complete: %w", full(err))
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("pgstore: complete: key %x: %w", id, store.ErrStaleOwner)
	}
	return nil
}

// Extend implements [store.Store.Extend] in one statement. lockTTL must be
// at least 1 µs.
func (s *Store) Extend(ctx context.Context, id store.ID, owner store.Owner, lockTTL time.Duration) error {
	if err := checkTTL("lock TTL", lockTTL); err != nil {
		return fmt.Errorf("pgstore: extend: %w", err)
	}
	tag, err := s.db.Exec(ctx, s.extendSQL, id[:], owner[:], ceilUS(lockTTL))
	if err != nil {
		return fmt.Errorf("pgstore: extend: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("pgstore: extend: key %x: %w", id, store.ErrStaleOwner)
	}
	return nil
}

// ceilUS rounds a lock's duration up to whole microseconds, PostgreSQL's
// resolution (see store.Store: a lock never ends before its holder thinks;
// saturating).
func ceilUS(d time.Duration) time.Duration {
	if r := d % time.Microsecond; r != 0 && d <= math.MaxInt64-time.Microsecond {
		return d - r + time.Microsecond
	}
	return d.Truncate(time.Microsecond)
}

// checkTTL refuses a duration PostgreSQL would round to nothing: it keeps
// time in whole microseconds.
func checkTTL(what string, d time.Duration) error {
	if d < time.Microsecond {
		return fmt.Errorf("%s %v is under PostgreSQL's resolution of 1µs", what, d)
	}
	return nil
}

// noRoom are the SQLSTATE codes that mean the server has no room for what
// was written: disk_full, out_of_memory, program_limit_exceeded.
var noRoom = []string{"53100", "53200", "54000"}

// full wraps err with store.ErrStoreFull too when it says the server has
// no room.
func full(err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && slices.Contains(noRoom, pe.Code) {
		return fmt.Errorf("%w: %w", store.ErrStoreFull, err)
	}
	return err
}

// Release implements [store.Store.Release] in one statement.
func (s *Store) Release(ctx context.Context, id store.ID, owner store.Owner) error {
	tag, err := s.db.Exec(ctx, s.releaseSQL, id[:], owner[:])
	if err != nil {
		return fmt.Errorf("pgstore: release: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("pgstore: release: key %x: %w", id, store.ErrStaleOwner)
	}
	return nil
}

// DeleteExpired deletes every expired lock and record and returns how many
// rows it deleted. Run it periodically (e.g. every few minutes from one
// server); expired rows are ignored by Begin even before they are deleted.
func (s *Store) DeleteExpired(ctx context.Context) (int64, error) {
	tag, err := s.db.Exec(ctx, s.deleteExpiredSQL)
	if err != nil {
		return 0, fmt.Errorf("pgstore: delete expired: %w", err)
	}
	return tag.RowsAffected(), nil
}
