package metastore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/questrt/questrt/plan"
)

// Errors callers act on. Errors that wrap them keep their own message:
// errors.Is finds the sentinel.
var (
	// ErrInUse: another opener holds the table (a writable open
	// excludes every other open; read-only opens share it).
	ErrInUse = errors.New("metastore: in use by another opener")
	// ErrCorrupt: the table's file, or one of its records, is damaged.
	ErrCorrupt = errors.New("metastore: damaged")
	// ErrOtherFormat: Init found the format record of another grid or
	// geometry (the error is a *FormatError).
	ErrOtherFormat = errors.New("metastore: another format")
	// ErrReadOnly: a write to a table opened read-only.
	ErrReadOnly = errors.New("metastore: opened read-only")
	// ErrClosed: a call after Close.
	ErrClosed = errors.New("metastore: closed")
)

// SeqTable is a worker's durable sequence table: the format record of
// its data directory, one [Entry] per sequence under a key the table
// gives, and the [StepMark]s of the open decode step.
//
// Every write is one atomic commit, durable when it returns: after a
// crash (kill -9) the table holds exactly the writes that returned nil
// (and perhaps the one in flight, whole or not at all). A SeqTable is
// safe for concurrent use; writes are serialized. Every method but
// Close checks ctx first and, when it is done, returns ctx.Err()
// changing nothing; a write itself is not interrupted (a commit is not
// left half done).
type SeqTable interface {
	// Init checks the table's format record against f and commits f
	// when the table has none. A table holding another record fails
	// with a *FormatError (ErrOtherFormat) and is not changed.
	Init(ctx context.Context, f Format) error
	// Format returns the table's format record; ok is false, with no
	// error, for a table that has none (never initialized). A record
	// that does not decode is an error wrapping ErrCorrupt.
	Format(ctx context.Context) (f Format, ok bool, err error)
	// Add commits e under a key never given before (the first is 1) and
	// returns the key.
	Add(ctx context.Context, e Entry) (key uint64, err error)
	// Put commits e under key, replacing what it held; a key Add has
	// not given yet is never given by a later Add.
	Put(ctx context.Context, key uint64, e Entry) error
	// Delete removes the entries of keys in one commit; a key with no
	// entry is not an error.
	Delete(ctx context.Context, keys ...uint64) error
	// Entries returns every entry by increasing key. An entry that does
	// not decode comes with Record.Err set (wrapping ErrCorrupt), so
	// that the caller can report it and delete it.
	Entries(ctx context.Context) ([]Record, error)
	// PutMarks commits the step markers of marks, by entry key, in one
	// commit, replacing the markers those keys had.
	PutMarks(ctx context.Context, marks map[uint64]StepMark) error
	// DeleteMarks removes the markers of keys in one commit; a key with
	// no marker is not an error.
	DeleteMarks(ctx context.Context, keys ...uint64) error
	// Marks returns every step marker by entry key; a marker that does
	// not decode is left out (a step with no marker is kept as
	// persisted, as one that needed none).
	Marks(ctx context.Context) (map[uint64]StepMark, error)
	// ClearMarks removes every step marker in one commit.
	ClearMarks(ctx context.Context) error
	// Close releases the table (and its lock). Close is idempotent;
	// what was committed stays for the next open.
	Close() error
}

// Options configures an open of a table.
type Options struct {
	// ReadOnly opens the table for reading: writes fail with
	// ErrReadOnly, and other read-only opens may share it.
	ReadOnly bool
	// Timeout bounds the wait for another opener's lock, then the open
	// fails with ErrInUse; 0 waits for ever (bbolt) or not at all (Mem).
	Timeout time.Duration
	// MmapBytes, when above 0, is how much of a bbolt file is mapped at
	// open (bolt.Options.InitialMmapSize): a file that grows within it
	// is never remapped, and a remap inside a write transaction copies
	// every value the transaction holds out of the map (a commit of
	// many large values then spends most of its CPU there). Address
	// space only: the file grows as written. 0: bbolt's default (the
	// map doubles with the file). An open whose map fails (an address
	// space limit, ulimit -v) is retried mapping a quarter as much,
	// down to 1 MiB, then with bbolt's default. Mem ignores it.
	MmapBytes int
}

// Format is what a data directory was made for: a worker on it must
// have these Layers, Geometry, CP and TP and host these Ranks.
//
// The JSON names of Format, Rank, Entry, EntryRank and StepMark are
// the on-disk encoding of the bbolt table (with the format record's
// "version" first): never change them.
type Format struct {
	Layers int `json:"layers"`
	plan.Geometry
	CP    int    `json:"cp"`
	TP    int    `json:"tp"`
	Ranks []Rank `json:"ranks"`
}

// Rank is one hosted (TP, CP) rank.
type Rank struct{ TP, CP int }

// Entry is one sequence of the table.
type Entry struct {
	// Seq is the coordinator's id of the sequence and Grid the grid that
	// created it; (Grid, Seq) names it on every worker of its grid.
	Seq  uint64 `json:"seq"`
	Grid string `json:"grid,omitempty"`
	// Nodes are the grid's node names per rank when the entry was first
	// written (empty when none was known).
	Nodes []string `json:"nodes,omitempty"`
	// Placement and BlockPages are the sequence's layout (its CP and TP
	// are the format's).
	Placement  plan.Placement `json:"placement"`
	BlockPages int            `json:"block_pages"`
	// Ranks name the sequence's store sequence on every hosted rank, in
	// the format's order.
	Ranks []EntryRank `json:"ranks"`
	// Damaged, when not empty, makes the entry a tombstone: the
	// sequence was dropped because a page of it failed its check after
	// the open (its store sequences are released, Ranks is empty), and
	// Damaged says why, for the next open to report it. A table reader
	// that does not know the field finds an entry naming no rank,
	// which it reports damaged too.
	Damaged string `json:"damaged,omitempty"`
}

// EntryRank is one hosted rank of an entry and the id of the sequence
// in that rank's page store.
type EntryRank struct {
	TP    int    `json:"tp"`
	CP    int    `json:"cp"`
	Store uint64 `json:"store"`
}

// StepMark is the step marker of one sequence: its store lengths when
// the open step began, so that recovery can undo the step's appends.
type StepMark struct {
	Step uint64 `json:"step"`
	// Lens are the store lengths per hosted rank (the format's order)
	// and layer: -1 for a layer or rank the step does not append to,
	// nil for a rank that stores none of its tokens.
	Lens [][]int `json:"lens"`
}

// Record is one entry as Entries read it.
type Record struct {
	Key   uint64
	Entry Entry
	// Err is why the entry did not decode (wrapping ErrCorrupt); Entry
	// is then the zero value.
	Err error
}

// FormatError is Init's error for a table whose format record is not
// the opener's: Have and Want are the two records as encoded.
type FormatError struct{ Have, Want []byte }

// Error says both records.
func (e *FormatError) Error() string {
	return fmt.Sprintf("metastore: the table's format record is %s, not %s", e.Have, e.Want)
}

// Is makes a FormatError match ErrOtherFormat.
func (e *FormatError) Is(target error) bool { return target == ErrOtherFormat }

// formatVersion is the format record's version.
const formatVersion = 1

// formatRecord is the format record as encoded: its version first.
type formatRecord struct {
	Version int `json:"version"`
	Format
}

// encodeFormat returns f's format record.
func encodeFormat(f Format) ([]byte, error) {
	b, err := json.Marshal(formatRecord{Version: formatVersion, Format: f})
	if err != nil {
		return nil, fmt.Errorf("metastore: encode format record: %w", err)
	}
	return b, nil
}

// decodeFormat decodes a format record.
func decodeFormat(raw []byte) (Format, error) {
	var r formatRecord
	if err := json.Unmarshal(raw, &r); err != nil || r.Version != formatVersion {
		return Format{}, corrupt(fmt.Errorf("format record %q does not decode (version %d, %v)", raw, r.Version, err))
	}
	return r.Format, nil
}

// corruptError marks err as damage (errors.Is(_, ErrCorrupt)) keeping
// its message and its own chain.
type corruptError struct{ err error }

func (e corruptError) Error() string   { return e.err.Error() }
func (e corruptError) Unwrap() []error { return []error{ErrCorrupt, e.err} }

// corrupt returns err marked as damage (nil for nil).
func corrupt(err error) error {
	if err == nil || errors.Is(err, ErrCorrupt) {
		return err
	}
	return corruptError{err}
}
