// Package pgstore is an [idempotency.Store] on PostgreSQL, through
// github.com/jackc/pgx/v5.
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
// A statement executed twice (its first reply lost) is harmless: a claim
// that finds the caller's own owner token claims, and a completion that
// finds the caller's own identical record succeeds. Server errors that mean
// no room (disk full, out of memory, a value over a limit) wrap
// [idempotency.ErrStoreFull].
//
// Usage:
//
//	pool, err := pgxpool.New(ctx, "postgres://...")
//	store, err := pgstore.New(pool, pgstore.Config{Table: "idempotency_keys"})
//	err = store.Migrate(ctx) // once, e.g. at deploy time
//	mw, err := idempotency.NewMiddleware(store, idempotency.WithScope(tenantOf))
//
// Time comes from the Go process ([Config.Now]), not from the database's
// now(), so every server sharing the table needs a synchronised clock (as
// for any lease); tests inject a fake clock.
package pgstore

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stormguard/stormguard/idempotency"
)

// DB is what the store needs from PostgreSQL; *pgxpool.Pool satisfies it
// (and is what a server shares between goroutines), as do *pgx.Conn and
// pgx.Tx for single-goroutine use.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// DefaultTable is the table name used when [Config.Table] is empty.
const DefaultTable = "stormguard_idempotency"

// Config configures a [Store]. The zero value is usable.
type Config struct {
	// Table is the table's name, optionally schema-qualified
	// ("schema.table"); each part is 1 to 63 letters, digits or
	// underscores, not starting with a digit. Empty means [DefaultTable].
	Table string
	// Now returns the current time; nil means time.Now.
	Now func() time.Time
}

// Store is an [idempotency.Store] on PostgreSQL. It is safe for concurrent
// use when its DB is (a *pgxpool.Pool is), and many processes may share
// one table.
type Store struct {
	db  DB
	now func() time.Time

	table, index                                 string // sanitized identifiers
	beginSQL, completeSQL, extendSQL, releaseSQL string
	deleteExpiredSQL, migrateSQL, dropSQL        string
}

var (
	_ idempotency.Store      = (*Store)(nil)
	_ idempotency.TTLChecker = (*Store)(nil)
)

var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)

// New returns a store on db. It fails when db is nil (or a nil pointer,
// such as a nil *pgxpool.Pool) or the table name is invalid. It does not
// touch the database; call [Store.Migrate] first.
func New(db DB, cfg Config) (*Store, error) {
	if v := reflect.ValueOf(db); !v.IsValid() || (v.Kind() == reflect.Pointer && v.IsNil()) {
		return nil, errors.New("pgstore: New: nil DB")
	}
	if cfg.Table == "" {
		cfg.Table = DefaultTable
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
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
	if len(name) > 63-len("_expires_idx") {
		name = name[:63-len("_expires_idx")]
	}
	t := pgx.Identifier(parts).Sanitize()
	s := &Store{db: db, now: cfg.Now, table: t, index: pgx.Identifier{name + "_expires_idx"}.Sanitize()}
	// Rows: record NULL = locked (in progress) until expires_at; record set
	// = completed, kept until expires_at.
	s.migrateSQL = `CREATE TABLE IF NOT EXISTS ` + t + ` (
	key         bytea PRIMARY KEY,
	fingerprint bytea NOT NULL,
	owner       bytea NOT NULL,
	record      bytea,
	expires_at  timestamptz NOT NULL
);
CREATE INDEX IF NOT EXISTS ` + s.index + ` ON ` + t + ` (expires_at)`
	// $1 key, $2 fingerprint, $3 new owner, $4 now, $5 lock expiry. An
	// expired row is replaced; a live one is returned unchanged (the no-op
	// update locks it and makes RETURNING give its latest version, which a
	// plain SELECT in the same statement could miss under concurrency).
	s.beginSQL = `INSERT INTO ` + t + ` AS t (key, fingerprint, owner, record, expires_at)
VALUES ($1, $2, $3, NULL, $5)
ON CONFLICT (key) DO UPDATE SET
	fingerprint = CASE WHEN t.expires_at <= $4 THEN excluded.fingerprint ELSE t.fingerprint END,
	owner       = CASE WHEN t.expires_at <= $4 THEN excluded.owner ELSE t.owner END,
	record      = CASE WHEN t.expires_at <= $4 THEN NULL ELSE t.record END,
	expires_at  = CASE WHEN t.expires_at <= $4 THEN excluded.expires_at ELSE t.expires_at END
RETURNING t.owner, t.fingerprint, t.record`
	// $1 key, $2 owner, $3 now, $4 record, $5 retention end. The owner's
	// live lock, or its own identical record (a resent completion).
	s.completeSQL = `UPDATE ` + t + ` SET record = $4, expires_at = $5
WHERE key = $1 AND owner = $2 AND expires_at > $3 AND (record IS NULL OR record = $4)`
	// $1 key, $2 owner, $3 now, $4 new lock expiry.
	s.extendSQL = `UPDATE ` + t + ` SET expires_at = $4
WHERE key = $1 AND owner = $2 AND record IS NULL AND expires_at > $3`
	// $1 key, $2 owner, $3 now.
	s.releaseSQL = `DELETE FROM ` + t + `
WHERE key = $1 AND owner = $2 AND record IS NULL AND expires_at > $3`
	s.deleteExpiredSQL = `DELETE FROM ` + t + ` WHERE expires_at <= $1`
	s.dropSQL = `DROP TABLE IF EXISTS ` + t
	return s, nil
}

// Migrate creates the table and its expiry index if they do not exist.
func (s *Store) Migrate(ctx context.Context) error {
	if _, err := s.db.Exec(ctx, s.migrateSQL); err != nil {
		return fmt.Errorf("pgstore: migrate %s: %w", s.table, err)
	}
	return nil
}

// DropTable drops the table (and so every key). Meant for tests and
// uninstallation.
func (s *Store) DropTable(ctx context.Context) error {
	if _, err := s.db.Exec(ctx, s.dropSQL); err != nil {
		return fmt.Errorf("pgstore: drop %s: %w", s.table, err)
	}
	return nil
}

// Begin implements [idempotency.Store.Begin] in one statement.
func (s *Store) Begin(ctx context.Context, key idempotency.Key, fp idempotency.Fingerprint, lockTTL time.Duration) (idempotency.Result, error) {
	if lockTTL <= 0 {
		return idempotency.Result{}, fmt.Errorf("pgstore: begin: lock TTL %v, want > 0", lockTTL)
	}
	owner := idempotency.NewOwner()
	now := s.now()
	var gotOwner, gotFP, rec []byte
	err := s.db.QueryRow(ctx, s.beginSQL, key[:], fp[:], owner[:], now, now.Add(lockTTL)).Scan(&gotOwner, &gotFP, &rec)
	if err != nil {
		return idempotency.Result{}, fmt.Errorf("pgstore: begin: %w", full(err))
	}
	switch {
	case string(gotOwner) == string(owner[:]):
		return idempotency.Result{Outcome: idempotency.Claimed, Owner: owner}, nil
	case string(gotFP) != string(fp[:]):
		return idempotency.Result{Outcome: idempotency.Mismatch}, nil
	case rec == nil:
		return idempotency.Result{Outcome: idempotency.InProgress}, nil
	}
	r, err := idempotency.DecodeRecord(rec)
	if err != nil {
		return idempotency.Result{}, fmt.Errorf("pgstore: begin: key %v: %w", key, err)
	}
	return idempotency.Result{Outcome: idempotency.Completed, Record: r}, nil
}

// Complete implements [idempotency.Store.Complete] in one statement.
func (s *Store) Complete(ctx context.Context, key idempotency.Key, owner idempotency.Owner, rec idempotency.Record, retention time.Duration) error {
	if retention <= 0 {
		return fmt.Errorf("pgstore: complete: retention %v, want > 0", retention)
	}
	b, err := rec.MarshalBinary()
	if err != nil {
		return fmt.Errorf("pgstore: complete: %w", err)
	}
	now := s.now()
	tag, err := s.db.Exec(ctx, s.completeSQL, key[:], owner[:], now, b, now.Add(retention))
	if err != nil {
		return fmt.Errorf("pgstore: complete: %w", full(err))
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("pgstore: complete: key %v: %w", key, idempotency.ErrStaleOwner)
	}
	return nil
}

// Extend implements [idempotency.Store.Extend] in one statement.
func (s *Store) Extend(ctx context.Context, key idempotency.Key, owner idempotency.Owner, lockTTL time.Duration) error {
	if lockTTL <= 0 {
		return fmt.Errorf("pgstore: extend: lock TTL %v, want > 0", lockTTL)
	}
	now := s.now()
	tag, err := s.db.Exec(ctx, s.extendSQL, key[:], owner[:], now, now.Add(lockTTL))
	if err != nil {
		return fmt.Errorf("pgstore: extend: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("pgstore: extend: key %v: %w", key, idempotency.ErrStaleOwner)
	}
	return nil
}

// CheckTTL implements [idempotency.TTLChecker]: PostgreSQL keeps
// timestamps in whole microseconds, so d must be at least 1 µs.
func (s *Store) CheckTTL(d time.Duration) error {
	if d < time.Microsecond {
		return fmt.Errorf("pgstore: %v is under PostgreSQL's resolution of 1µs", d)
	}
	return nil
}

// noRoom are the SQLSTATE codes that mean the server has no room for what
// was written: disk_full, out_of_memory, program_limit_exceeded.
var noRoom = []string{"53100", "53200", "54000"}

// full wraps err with idempotency.ErrStoreFull too when it says the server
// has no room.
func full(err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && slices.Contains(noRoom, pe.Code) {
		return fmt.Errorf("%w: %w", idempotency.ErrStoreFull, err)
	}
	return err
}

// Release implements [idempotency.Store.Release] in one statement.
func (s *Store) Release(ctx context.Context, key idempotency.Key, owner idempotency.Owner) error {
	tag, err := s.db.Exec(ctx, s.releaseSQL, key[:], owner[:], s.now())
	if err != nil {
		return fmt.Errorf("pgstore: release: %w", err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("pgstore: release: key %v: %w", key, idempotency.ErrStaleOwner)
	}
	return nil
}

// DeleteExpired deletes every expired lock and record and returns how many
// rows it deleted. Run it periodically (e.g. every few minutes from one
// server); expired rows are ignored by Begin even before they are deleted.
func (s *Store) DeleteExpired(ctx context.Context) (int64, error) {
	tag, err := s.db.Exec(ctx, s.deleteExpiredSQL, s.now())
	if err != nil {
		return 0, fmt.Errorf("pgstore: delete expired: %w", err)
	}
	return tag.RowsAffected(), nil
}
