package metastore

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/questrt/questrt/internal/boltcheck"
)

// The bbolt sequence table, one file (the worker's worker.db):
//
//	meta/format   the format record (JSON, "version" first)
//	meta/next     the next key Add gives (8 bytes, big-endian)
//	seqs/<key>    one Entry (JSON) per 8-byte big-endian key
//	steps/<key>   one StepMark (JSON) per entry key with a marker
//
// Names, keys and encodings are those of the files written before this
// package existed (worker/testdata/table-v1 holds one).
var (
	bkMeta  = []byte("meta")
	bkSeqs  = []byte("seqs")
	bkSteps = []byte("steps")
	kFormat = []byte("format")
	kNext   = []byte("next")
)

// boltTable is a SeqTable in a bbolt file.
type boltTable struct{ boltFile }

// OpenBolt opens the bbolt sequence table at path, creating it (mode
// 0600) unless opt.ReadOnly. The file is checked first
// (internal/boltcheck): a damaged one fails with an error wrapping
// ErrCorrupt, and a lock held past opt.Timeout with ErrInUse. Other
// errors (permissions, a missing file read-only) are the system's.
func OpenBolt(path string, opt Options) (SeqTable, error) {
	db, err := openChecked(path, opt, bolt.FreelistArrayType)
	if err != nil {
		return nil, err
	}
	return &boltTable{boltFile{db: db, readOnly: opt.ReadOnly}}, nil
}

// CheckFile opens the bbolt file at path read-only through the checks
// of OpenBolt and closes it: nil for a file whose structure holds, an
// error wrapping ErrCorrupt for a damaged one, ErrInUse when a writer
// holds it past timeout. Any bbolt file of a data directory may be
// checked so (the page stores' and the disk tier's too).
func CheckFile(path string, timeout time.Duration) error {
	db, err := openChecked(path, Options{ReadOnly: true, Timeout: timeout}, bolt.FreelistArrayType)
	if err != nil {
		return err
	}
	return db.Close()
}

// openChecked is boltcheck.OpenChecked with its errors as this
// package's; freelist is the freelist's type in memory (the file is the
// same with either).
func openChecked(path string, opt Options, freelist bolt.FreelistType) (*bolt.DB, error) {
	m := max(opt.MmapBytes, 0)
	for {
		db, err := openCheckedMap(path, opt, freelist, m)
		if err == nil || m == 0 || errors.Is(err, ErrInUse) || errors.Is(err, ErrCorrupt) {
			return db, err
		}
		// The map may not fit the address space (ulimit -v): map less,
		// down to bbolt's default, which the file's size bounds. An
		// error of another cause is met again at 0 and returned then.
		if m /= 4; m < mmapFloor {
			m = 0
		}
	}
}

// mmapFloor is the smallest Options.MmapBytes openChecked tries after a
// failed open before bbolt's default.
const mmapFloor = 1 << 20

// openCheckedMap is openChecked mapping mmap bytes at open.
func openCheckedMap(path string, opt Options, freelist bolt.FreelistType, mmap int) (*bolt.DB, error) {
	bo := &bolt.Options{Timeout: opt.Timeout, FreelistType: freelist, InitialMmapSize: mmap}
	if opt.ReadOnly {
		bo.ReadOnly, bo.PreLoadFreelist = true, true
	}
	db, err := boltcheck.OpenChecked(path, 0o600, bo)
	switch {
	case errors.Is(err, berrors.ErrTimeout):
		return nil, fmt.Errorf("metastore: %s: %w", path, ErrInUse)
	case errors.Is(err, boltcheck.ErrCorrupt):
		return nil, corrupt(err)
	case err != nil:
		return nil, err
	}
	return db, nil
}

// boltFile is an open bbolt file of this package.
type boltFile struct {
	db       *bolt.DB
	readOnly bool
	closed   atomic.Bool
}

// view runs fn in a checked read transaction.
func (f *boltFile) view(ctx context.Context, fn func(*bolt.Tx) error) error {
	if err := f.usable(ctx); err != nil {
		return err
	}
	return txError(boltcheck.View(f.db, fn))
}

// update runs fn in a checked write transaction: one commit.
func (f *boltFile) update(ctx context.Context, fn func(*bolt.Tx) error) error {
	if err := f.usable(ctx); err != nil {
		return err
	}
	if f.readOnly {
		return ErrReadOnly
	}
	return txError(boltcheck.Update(f.db, fn))
}

func (f *boltFile) usable(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if f.closed.Load() {
		return ErrClosed
	}
	return nil
}

// Close closes the file; idempotent.
func (f *boltFile) Close() error {
	if f.closed.Swap(true) {
		return nil
	}
	return f.db.Close()
}

// txError returns a transaction's error as this package's.
func txError(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, boltcheck.ErrCorrupt):
		return corrupt(err)
	case errors.Is(err, berrors.ErrDatabaseNotOpen):
		return fmt.Errorf("%w: %w", ErrClosed, err)
	}
	return err
}

func key8(k uint64) []byte { return binary.BigEndian.AppendUint64(nil, k) }

func (t *boltTable) Init(ctx context.Context, f Format) error {
	want, err := encodeFormat(f)
	if err != nil {
		return err
	}
	return t.update(ctx, func(tx *bolt.Tx) error {
		mb, err := tx.CreateBucketIfNotExists(bkMeta)
		if err != nil {
			return err
		}
		if _, err := tx.CreateBucketIfNotExists(bkSeqs); err != nil {
			return err
		}
		if have := mb.Get(kFormat); have != nil && string(have) != string(want) {
			return &FormatError{Have: append([]byte(nil), have...), Want: want}
		}
		return mb.Put(kFormat, want)
	})
}

func (t *boltTable) Format(ctx context.Context) (Format, bool, error) {
	var raw []byte
	err := t.view(ctx, func(tx *bolt.Tx) error {
		if mb := tx.Bucket(bkMeta); mb != nil {
			if v := mb.Get(kFormat); v != nil {
				raw = append([]byte(nil), v...)
			}
		}
		return nil
	})
	if err != nil || raw == nil {
		return Format{}, false, err
	}
	f, err := decodeFormat(raw)
	return f, err == nil, err
}

// put commits e under key (a new key when key is 0) and moves the next
// key past it.
func (t *boltTable) put(ctx context.Context, key uint64, e Entry) (uint64, error) {
	b, err := json.Marshal(e)
	if err != nil {
		return 0, fmt.Errorf("metastore: encode entry: %w", err)
	}
	err = t.update(ctx, func(tx *bolt.Tx) error {
		mb, err := tx.CreateBucketIfNotExists(bkMeta)
		if err != nil {
			return err
		}
		sb, err := tx.CreateBucketIfNotExists(bkSeqs)
		if err != nil {
			return err
		}
		next := uint64(1)
		if v := mb.Get(kNext); len(v) == 8 {
			next = max(binary.BigEndian.Uint64(v), 1)
		}
		if key == 0 {
			key = next
		}
		if err := sb.Put(key8(key), b); err != nil {
			return err
		}
		return mb.Put(kNext, key8(max(next, key+1)))
	})
	if err != nil {
		return 0, err
	}
	return key, nil
}

func (t *boltTable) Add(ctx context.Context, e Entry) (uint64, error) { return t.put(ctx, 0, e) }

func (t *boltTable) Put(ctx context.Context, key uint64, e Entry) error {
	if key == 0 {
		return fmt.Errorf("metastore: put: key 0 is never given")
	}
	_, err := t.put(ctx, key, e)
	return err
}

// deleteKeys removes keys from bucket name in one commit.
func (t *boltTable) deleteKeys(ctx context.Context, name []byte, keys []uint64) error {
	return t.update(ctx, func(tx *bolt.Tx) error {
		b := tx.Bucket(name)
		if b == nil {
			return nil
		}
		for _, k := range keys {
			if err := b.Delete(key8(k)); err != nil {
				return err
			}
		}
		return nil
	})
}

func (t *boltTable) Delete(ctx context.Context, keys ...uint64) error {
	return t.deleteKeys(ctx, bkSeqs, keys)
}

func (t *boltTable) Entries(ctx context.Context) ([]Record, error) {
	var out []Record
	err := t.view(ctx, func(tx *bolt.Tx) error {
		b := tx.Bucket(bkSeqs)
		if b == nil {
			return nil
		}
		return b.ForEach(func(k, v []byte) error {
			if len(k) != 8 {
				return nil
			}
			r := Record{Key: binary.BigEndian.Uint64(k)}
			if err := json.Unmarshal(v, &r.Entry); err != nil {
				r.Entry, r.Err = Entry{}, corrupt(fmt.Errorf("table entry %d: %w", r.Key, err))
			}
			out = append(out, r)
			return nil
		})
	})
	return out, err
}

func (t *boltTable) PutMarks(ctx context.Context, marks map[uint64]StepMark) error {
	enc := make(map[uint64][]byte, len(marks))
	for k, m := range marks {
		b, err := json.Marshal(m)
		if err != nil {
			return fmt.Errorf("metastore: encode step marker: %w", err)
		}
		enc[k] = b
	}
	return t.update(ctx, func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists(bkSteps)
		if err != nil {
			return err
		}
		for k, v := range enc {
			if err := b.Put(key8(k), v); err != nil {
				return err
			}
		}
		return nil
	})
}

func (t *boltTable) DeleteMarks(ctx context.Context, keys ...uint64) error {
	return t.deleteKeys(ctx, bkSteps, keys)
}

func (t *boltTable) Marks(ctx context.Context) (map[uint64]StepMark, error) {
	out := map[uint64]StepMark{}
	err := t.view(ctx, func(tx *bolt.Tx) error {
		b := tx.Bucket(bkSteps)
		if b == nil {
			return nil
		}
		return b.ForEach(func(k, v []byte) error {
			if len(k) != 8 {
				return nil
			}
			var m StepMark
			if json.Unmarshal(v, &m) != nil {
				return nil // its bbolt page is sound, its JSON is not: left out
			}
			out[binary.BigEndian.Uint64(k)] = m
			return nil
		})
	})
	return out, err
}

func (t *boltTable) ClearMarks(ctx context.Context) error {
	return t.update(ctx, func(tx *bolt.Tx) error {
		if tx.Bucket(bkSteps) == nil {
			return nil
		}
		if err := tx.DeleteBucket(bkSteps); err != nil {
			return err
		}
		_, err := tx.CreateBucket(bkSteps)
		return err
	})
}
