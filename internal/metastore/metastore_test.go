package metastore_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/questrt/questrt/internal/boltcheck"
	"github.com/questrt/questrt/internal/metastore"
	"github.com/questrt/questrt/internal/metastore/metastoretest"
	"github.com/questrt/questrt/pagestore/tier"
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

func TestBoltManifests(t *testing.T) {
	metastoretest.RunManifests(t, func(t *testing.T) metastoretest.ManifestsOpener {
		path := filepath.Join(t.TempDir(), "store.db")
		return func(opt metastore.Options) (metastore.Manifests, error) {
			return metastore.OpenBoltManifests(path, opt)
		}
	})
}

func TestMemManifests(t *testing.T) {
	metastoretest.RunManifests(t, func(t *testing.T) metastoretest.ManifestsOpener { return metastore.NewMemManifests().Open })
}

// TestBoltManifestsDamage: a header, a table chunk and a slot record
// whose checksums fail are reported per record, wrapping ErrCorrupt and
// tier.ErrCorrupt, and the others load.
func TestBoltManifestsDamage(t *testing.T) {
	path := filepath.Join(t.TempDir(), "store.db")
	m, err := metastore.OpenBoltManifests(path, metastore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	f := metastore.ManifestFormat{Layers: 2, KVHeads: 2, HeadDim: 16, PageSize: 16, DType: plan.FP8}
	if err := m.Init(ctx, f); err != nil {
		t.Fatal(err)
	}
	var put []metastore.Manifest
	for id := uint64(1); id <= 3; id++ {
		put = append(put, metastore.Manifest{ID: id, LenRec: int32(id), Lens: []int{32, 31}, Slots: []int32{int32(2 * id), int32(2*id + 1)}})
	}
	if err := m.Commit(ctx, metastore.ManifestBatch{Put: put, SlotCRC: map[int32]uint32{2: 1, 3: 2, 4: 3}, NextID: 4}); err != nil {
		t.Fatal(err)
	}
	m.Close()
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		flip := func(bucket string, key []byte) error {
			b := tx.Bucket([]byte(bucket))
			v := bytes.Clone(b.Get(key))
			v[5] ^= 1
			return b.Put(key, v)
		}
		if got := tx.Bucket([]byte("meta")).Get([]byte("format")); len(got) != 21 || got[20] != byte(plan.FP8) {
			t.Errorf("fp8 format record %x, want 21 bytes ending in the dtype", got)
		}
		return errors.Join(flip("seqs", []byte{0, 0, 0, 0, 0, 0, 0, 1}), flip("tables", []byte{0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0}), flip("slots", []byte{0, 0, 0, 3}))
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	m, err = metastore.OpenBoltManifests(path, metastore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := m.Init(ctx, f); err != nil {
		t.Fatal(err)
	}
	ld, err := m.Load(ctx)
	if err != nil || len(ld.Manifests) != 3 || ld.NextID != 4 {
		t.Fatalf("load: %+v, %v", ld, err)
	}
	for i, want := range []string{"manifest: value checksum", "table chunk 0: value checksum", ""} {
		r := ld.Manifests[i]
		if want == "" {
			if r.Err != nil || !reflect.DeepEqual(r.Manifest, put[i]) {
				t.Errorf("manifest 3: %+v, want it whole", r)
			}
			continue
		}
		if !errors.Is(r.Err, metastore.ErrCorrupt) || !errors.Is(r.Err, tier.ErrCorrupt) || !strings.HasPrefix(r.Err.Error(), want) || r.Manifest.ID != uint64(i+1) {
			t.Errorf("manifest %d: %+v, want %q (ErrCorrupt, tier.ErrCorrupt)", i+1, r, want)
		}
	}
	if len(ld.Manifests[1].Manifest.Lens) != 2 {
		t.Errorf("manifest 2, its table damaged: %+v, want its header's lengths", ld.Manifests[1].Manifest)
	}
	if e := ld.BadSlots[3]; !errors.Is(e, tier.ErrCorrupt) || !strings.HasPrefix(e.Error(), "slot 3 record: ") || len(ld.SlotCRC) != 2 {
		t.Errorf("slot records: %v good, %v bad; want slot 3 bad", ld.SlotCRC, ld.BadSlots)
	}
}

func TestBoltSlotIndex(t *testing.T) {
	metastoretest.RunSlotIndex(t, func(t *testing.T) metastoretest.SlotIndexOpener {
		path := filepath.Join(t.TempDir(), "index.db")
		return func(opt metastore.Options) (metastore.SlotIndex, error) {
			return metastore.OpenBoltSlotIndex(path, opt)
		}
	})
}

func TestMemSlotIndex(t *testing.T) {
	metastoretest.RunSlotIndex(t, func(t *testing.T) metastoretest.SlotIndexOpener { return metastore.NewMemSlotIndex().Open })
}

// TestBoltSummariesDamage: a summary record whose checksum fails is
// reported in BadSummaries (ErrCorrupt, tier.ErrCorrupt), one that
// describes another payload than its slot record names (written by
// code older than summary records after the newer code wrote it) is
// not returned, and a file without the summaries bucket loads with
// none.
func TestBoltSummariesDamage(t *testing.T) {
	path := filepath.Join(t.TempDir(), "store.db")
	m, err := metastore.OpenBoltManifests(path, metastore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	f := metastore.ManifestFormat{Layers: 1, KVHeads: 1, HeadDim: 4, PageSize: 4}
	if err := m.Init(ctx, f); err != nil {
		t.Fatal(err)
	}
	sums := map[int32][]byte{1: {1, 1, 1, 1}, 2: {2, 2, 2, 2}, 3: {3, 3, 3, 3}}
	if err := m.Commit(ctx, metastore.ManifestBatch{SlotCRC: map[int32]uint32{1: 11, 2: 12, 3: 13}, Summaries: sums}); err != nil {
		t.Fatal(err)
	}
	m.Close()
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte("sums"))
		v := bytes.Clone(b.Get([]byte{0, 0, 0, 2}))
		v[9] ^= 1
		if err := b.Put([]byte{0, 0, 0, 2}, v); err != nil {
			return err
		}
		// Slot 3 rewritten by older code: its slot record changes, the
		// summary record stays.
		sl := tx.Bucket([]byte("slots"))
		rec := []byte{1, 0, 0, 0, 99, 0, 0, 0}
		return sl.Put([]byte{0, 0, 0, 3}, binary.LittleEndian.AppendUint32(rec, crc32.Update(crc32.Update(0, crc32.MakeTable(crc32.Castagnoli), []byte{0, 0, 0, 3}), crc32.MakeTable(crc32.Castagnoli), rec)))
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	m, err = metastore.OpenBoltManifests(path, metastore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Init(ctx, f); err != nil {
		t.Fatal(err)
	}
	ld, err := m.Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(ld.Summaries, map[int32][]byte{1: {1, 1, 1, 1}}) || ld.SlotCRC[3] != 99 {
		t.Errorf("summaries %v (slot 3 crc %d), want slot 1's only", ld.Summaries, ld.SlotCRC[3])
	}
	if e := ld.BadSummaries[2]; len(ld.BadSummaries) != 1 || !errors.Is(e, metastore.ErrCorrupt) || !errors.Is(e, tier.ErrCorrupt) {
		t.Errorf("bad summaries %v, want slot 2's", ld.BadSummaries)
	}
	m.Close()
	// A file without the bucket (older code): no summaries.
	db, err = bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bolt.Tx) error { return tx.DeleteBucket([]byte("sums")) }); err != nil {
		t.Fatal(err)
	}
	db.Close()
	m, err = metastore.OpenBoltManifests(path, metastore.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if ld, err := m.Load(ctx); err != nil || ld.Summaries != nil || ld.BadSummaries != nil || len(ld.SlotCRC) != 3 {
		t.Fatalf("load without the bucket: %+v, %v", ld, err)
	}
}

// summaryBatch is a batch putting manifest 1, of two layers of n pages
// in slots 0..n-1, with an 8 KiB summary record a slot (byte i of slot
// sl's is sl*mul + i).
func summaryBatch(n int32, mul int) metastore.ManifestBatch {
	b := metastore.ManifestBatch{SlotCRC: map[int32]uint32{}, Summaries: map[int32][]byte{}, NextID: 2}
	var slots []int32
	for sl := range n {
		sum := make([]byte, 8<<10)
		for i := range sum {
			sum[i] = byte(int(sl)*mul + i)
		}
		b.SlotCRC[sl], b.Summaries[sl] = uint32(sl)+1, sum
		slots = append(slots, sl)
	}
	b.Put = []metastore.Manifest{{ID: 1, Lens: []int{int(n) * 16, int(n) * 16}, Slots: slots}}
	return b
}

// TestBoltManifestsMmapBytes: a file opened with MmapBytes far above
// what it holds stays the size of what was written (the map is address
// space only), and 256 summary records of 8 KiB committed at once
// through it load back whole, reopened without the option.
func TestBoltManifestsMmapBytes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "store.db")
	m, err := metastore.OpenBoltManifests(path, metastore.Options{MmapBytes: 256 << 20})
	if err != nil {
		t.Fatal(err)
	}
	f := metastore.ManifestFormat{Layers: 2, KVHeads: 4, HeadDim: 128, PageSize: 16, DType: plan.Float32}
	if err := m.Init(ctx, f); err != nil {
		t.Fatal(err)
	}
	b := summaryBatch(256, 7)
	if err := m.Commit(ctx, b); err != nil {
		t.Fatal(err)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Size() > 32<<20 {
		t.Fatalf("store.db is %d bytes after 2 MiB of records: the map grew the file", st.Size())
	}
	m, err = metastore.OpenBoltManifests(path, metastore.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := m.Init(ctx, f); err != nil {
		t.Fatal(err)
	}
	ld, err := m.Load(ctx)
	if err != nil || len(ld.Manifests) != 1 || len(ld.Summaries) != 256 || len(ld.BadSummaries) != 0 {
		t.Fatalf("load: %d manifests, %d summaries, %d bad, %v", len(ld.Manifests), len(ld.Summaries), len(ld.BadSummaries), err)
	}
	for sl, want := range b.Summaries {
		if !bytes.Equal(ld.Summaries[sl], want) {
			t.Fatalf("slot %d: summary record differs", sl)
		}
	}
}
