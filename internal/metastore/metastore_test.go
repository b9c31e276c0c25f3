package metastore_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/questrt/questrt/internal/boltcheck"
	"github.com/questrt/questrt/internal/metastore"
	"github.com/questrt/questrt/internal/metastore/metastoretest"
	"github.com/questrt/questrt/plan"
)

func TestBolt(t *testing.T) {
	metastoretest.Run(t, func(t *testing.T) metastoretest.Opener {
		path := filepath.Join(t.TempDir(), "table.db")
		return func(opt metastore.Options) (metastore.SeqTable, error) { return metastore.OpenBolt(path, opt) }
	})
}

func TestMem(t *testing.T) {
	metastoretest.Run(t, func(t *testing.T) metastoretest.Opener { return metastore.NewMem().Open })
}

var (
	ctx    = context.Background()
	format = metastore.Format{Layers: 2, Geometry: plan.Geometry{QHeads: 4, KVHeads: 2, HeadDim: 16, PageSize: 16}, CP: 2, TP: 1,
		Ranks: []metastore.Rank{{TP: 0, CP: 0}, {TP: 0, CP: 1}}}
	entry = metastore.Entry{Seq: 1, Grid: "fixture-grid", Nodes: []string{"node-a", "node-b"}, BlockPages: 2,
		Ranks: []metastore.EntryRank{{TP: 0, CP: 0, Store: 1}, {TP: 0, CP: 1, Store: 1}}}
	stepMark = metastore.StepMark{Step: 3, Lens: [][]int{{15, 15}, nil}}
)

// TestBoltLayout: the file holds the buckets, keys and JSON of the
// tables written before this package (worker/testdata/table-v1 has the
// same records, written by that code).
func TestBoltLayout(t *testing.T) {
	path := filepath.Join(t.TempDir(), "worker.db")
	st, err := metastore.OpenBolt(path, metastore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.Init(ctx, format); err != nil {
		t.Fatal(err)
	}
	if k, err := st.Add(ctx, entry); err != nil || k != 1 {
		t.Fatalf("Add: %d, %v", k, err)
	}
	if err := st.PutMarks(ctx, map[uint64]metastore.StepMark{1: stepMark}); err != nil {
		t.Fatal(err)
	}
	want := map[string]map[string]string{
		"meta": {
			"666f726d6174": `{"version":1,"layers":2,"QHeads":4,"KVHeads":2,"HeadDim":16,"PageSize":16,"DType":0,"cp":2,"tp":1,"ranks":[{"TP":0,"CP":0},{"TP":0,"CP":1}]}`,
			"6e657874":     "\x00\x00\x00\x00\x00\x00\x00\x02",
		},
		"seqs": {
			"0000000000000001": `{"seq":1,"grid":"fixture-grid","nodes":["node-a","node-b"],"placement":0,"block_pages":2,"ranks":[{"tp":0,"cp":0,"store":1},{"tp":0,"cp":1,"store":1}]}`,
		},
		"steps": {"0000000000000001": `{"step":3,"lens":[[15,15],null]}`},
	}
	st.Close()
	if got := metastoretest.BoltContents(t, path); !reflect.DeepEqual(got, want) {
		t.Fatalf("the file holds\n%q\nwant\n%q", got, want)
	}
}

// TestBoltKill: a copy of the file taken while the table is open (what
// kill -9 leaves) holds every write that returned.
func TestBoltKill(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "table.db")
	st, err := metastore.OpenBolt(path, metastore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.Init(ctx, format); err != nil {
		t.Fatal(err)
	}
	k, err := st.Add(ctx, entry)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.PutMarks(ctx, map[uint64]metastore.StepMark{k: stepMark}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	killed := filepath.Join(dir, "killed.db")
	if err := os.WriteFile(killed, b, 0o600); err != nil {
		t.Fatal(err)
	}
	st2, err := metastore.OpenBolt(killed, metastore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st2.Close()
	recs, err := st2.Entries(ctx)
	if err != nil || len(recs) != 1 || !reflect.DeepEqual(recs[0].Entry, entry) {
		t.Fatalf("entries of the killed table: %+v, %v", recs, err)
	}
	marks, err := st2.Marks(ctx)
	if err != nil || !reflect.DeepEqual(marks[k], stepMark) {
		t.Fatalf("marks of the killed table: %+v, %v", marks, err)
	}
	if k2, err := st2.Add(ctx, entry); err != nil || k2 != k+1 {
		t.Fatalf("Add on the killed table: %d, %v; want %d", k2, err, k+1)
	}
}

// TestBoltDamage: a damaged file is refused by OpenBolt and CheckFile
// (ErrCorrupt, boltcheck's error kept in the chain), and records that do
// not decode are reported or left out as documented.
func TestBoltDamage(t *testing.T) {
	dir := t.TempDir()
	junk := filepath.Join(dir, "junk.db")
	if err := os.WriteFile(junk, []byte(strings.Repeat("not a bbolt file ", 2000)), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := metastore.OpenBolt(junk, metastore.Options{}); !errors.Is(err, metastore.ErrCorrupt) || !errors.Is(err, boltcheck.ErrCorrupt) {
		t.Fatalf("open a junk file: %v, want ErrCorrupt (and boltcheck.ErrCorrupt)", err)
	}
	if err := metastore.CheckFile(junk, metastoretest.Timeout); !errors.Is(err, metastore.ErrCorrupt) {
		t.Fatalf("check a junk file: %v, want ErrCorrupt", err)
	}

	path := filepath.Join(dir, "table.db")
	st, err := metastore.OpenBolt(path, metastore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Init(ctx, format); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Add(ctx, entry); err != nil {
		t.Fatal(err)
	}
	if err := metastore.CheckFile(path, metastoretest.Timeout); !errors.Is(err, metastore.ErrInUse) {
		t.Fatalf("check a file a writer holds: %v, want ErrInUse", err)
	}
	st.Close()
	if err := metastore.CheckFile(path, metastoretest.Timeout); err != nil {
		t.Fatalf("check a sound file: %v", err)
	}
	// Records whose bbolt pages are sound and whose JSON is not.
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		if err := tx.Bucket([]byte("seqs")).Put([]byte{0, 0, 0, 0, 0, 0, 0, 2}, []byte("{bad")); err != nil {
			return err
		}
		sb, err := tx.CreateBucketIfNotExists([]byte("steps"))
		if err != nil {
			return err
		}
		if err := sb.Put([]byte{0, 0, 0, 0, 0, 0, 0, 1}, []byte("{bad")); err != nil {
			return err
		}
		return tx.Bucket([]byte("meta")).Put([]byte("format"), []byte(`{"version":2}`))
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	st, err = metastore.OpenBolt(path, metastore.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	recs, err := st.Entries(ctx)
	if err != nil || len(recs) != 2 || recs[0].Err != nil || !errors.Is(recs[1].Err, metastore.ErrCorrupt) ||
		!strings.HasPrefix(recs[1].Err.Error(), "table entry 2: ") {
		t.Fatalf("entries: %+v, %v; want entry 1, then entry 2 damaged", recs, err)
	}
	if marks, err := st.Marks(ctx); err != nil || len(marks) != 0 {
		t.Fatalf("marks: %+v, %v; want the damaged one left out", marks, err)
	}
	if _, ok, err := st.Format(ctx); ok || !errors.Is(err, metastore.ErrCorrupt) {
		t.Fatalf("format version 2: ok %v, %v; want ErrCorrupt", ok, err)
	}
}
