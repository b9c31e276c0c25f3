package worker

import (
	"encoding/json"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"sync"
	"testing"

	"github.com/questrt/questrt/internal/metastore/metastoretest"
	"github.com/questrt/questrt/pagestore"
	"github.com/questrt/questrt/plan"
)

// The fixture testdata/table-v1 is a worker data directory as a kill -9
// leaves it inside a decode step whose step markers are committed: the
// sequence table (format record, next key, three entries, one of them a
// fork, and one marker) and the ranks' page stores. It was written by
// the code before the sequence table moved behind internal/metastore
// (the commit that added it: git log --diff-filter=A -- worker/testdata),
// with
//
//	QUESTRT_WRITE_FIXTURE=1 go test -run TestTableFixture ./worker
//
// which also wrote testdata/table-v1.want.json: the table's contents,
// bucket by bucket, and what that code recovered from the directory.
// Rewriting it with later code would prove nothing: review the diff.

// fixtureDir is the fixture's directory.
const fixtureDir = "testdata/table-v1"

// fixtureWant is what the fixture holds and what recovers from it.
type fixtureWant struct {
	// Table is the sequence table's contents: bucket -> hex key ->
	// value (as a string: every value is JSON or a big-endian key).
	Table map[string]map[string]string `json:"table"`
	// Recovered is what NewLocal recovered: the sequences (parked) and
	// the damaged ones, and the orphans it released.
	Recovered   []RecoveredSeq `json:"recovered"`
	Damaged     []string       `json:"damaged"`
	OrphanSeqs  int            `json:"orphan_seqs"`
	ParkedCount int            `json:"parked"`
}

// fixtureConfig is the fixture's worker configuration.
func fixtureConfig() Config {
	cfg := testConfig(Exact)
	cfg.Capacity = 8
	cfg.GridID, cfg.Placement = "fixture-grid", []string{"node-a", "node-b"}
	// The fixture's stores verify at open: they write no summary
	// records (store.db as the fixture has it).
	cfg.Verify = pagestore.VerifyAtOpen
	return cfg
}

// writeFixture runs the fixture's workload on one persisting worker
// hosting both CP ranks and copies its data directory to dst at the
// point of the third decode step where its markers are committed.
func writeFixture(t *testing.T, dst string) {
	t.Helper()
	cfg := fixtureConfig()
	var mu sync.Mutex
	steps := 0
	var dirs []string
	cfg.CrashPoint = func(point string) {
		mu.Lock()
		defer mu.Unlock()
		if point != "step/marked" {
			return
		}
		if steps++; steps == 3 {
			copyDir(t, dirs[0], dst)
		}
	}
	g := newGrid(t, cfg, false)
	dirs = []string{t.TempDir()}
	g.reopen(dirs)
	rng := rand.New(rand.NewPCG(31, 2))
	g.create(1, plan.Striped)
	g.appendAll(rng, 1, 13)
	g.create(2, plan.Contiguous)
	g.appendAll(rng, 2, 20)
	g.fork(2, 3)
	g.create(4, plan.Striped)
	g.appendAll(rng, 4, 3)
	g.release(2)
	for range 3 { // positions 13, 14, 15: the third seals page 0
		g.stepAndCompare(rng, []uint64{1}, []int{64}, 0, cfg.Layers, true)
	}
	if steps < 3 {
		t.Fatalf("%d steps marked, want 3", steps)
	}
}

// recoverFixture opens a copy of the data directory dir and returns what
// it recovered.
func recoverFixture(t *testing.T, dir string) fixtureWant {
	t.Helper()
	cp := t.TempDir()
	copyDir(t, dir, cp)
	g := newGrid(t, fixtureConfig(), false)
	g.reopen([]string{cp})
	l := g.workers[0].(*Local)
	rep := l.Recovery()
	w := fixtureWant{Recovered: rep.Sequences, OrphanSeqs: rep.OrphanSeqs, ParkedCount: l.ParkedCount()}
	for _, d := range rep.Damaged {
		w.Damaged = append(w.Damaged, d.Err.Error())
	}
	return w
}

func marshalWant(t *testing.T, w fixtureWant) []byte {
	t.Helper()
	b, err := json.MarshalIndent(w, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	return append(b, '\n')
}

// TestTableFixture opens the fixture written by the code before the
// sequence table's move (see above): its table holds what it held then,
// it recovers as it did then, and the current code writes the same
// table contents, page store manifests and disk tier indexes, byte for
// byte, from the same workload.
func TestTableFixture(t *testing.T) {
	wantPath := fixtureDir + ".want.json"
	if os.Getenv("QUESTRT_WRITE_FIXTURE") == "1" {
		if err := os.RemoveAll(fixtureDir); err != nil {
			t.Fatal(err)
		}
		writeFixture(t, fixtureDir)
		w := recoverFixture(t, fixtureDir)
		w.Table = metastoretest.BoltContents(t, filepath.Join(fixtureDir, tableName))
		if err := os.WriteFile(wantPath, marshalWant(t, w), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote %s and %s", fixtureDir, wantPath)
	}
	raw, err := os.ReadFile(wantPath)
	if err != nil {
		t.Fatal(err)
	}
	var want fixtureWant
	if err := json.Unmarshal(raw, &want); err != nil {
		t.Fatal(err)
	}
	if len(want.Table["steps"]) != 1 || len(want.Table["seqs"]) != 3 || len(want.Recovered) != 3 {
		t.Fatalf("the fixture holds %d markers, %d entries, %d recovered; want 1, 3, 3", len(want.Table["steps"]), len(want.Table["seqs"]), len(want.Recovered))
	}
	got := recoverFixture(t, fixtureDir)
	got.Table = metastoretest.BoltContents(t, filepath.Join(fixtureDir, tableName))
	if g, w := marshalWant(t, got), marshalWant(t, want); string(g) != string(w) {
		t.Errorf("the fixture recovers as\n%s\nwant\n%s", g, w)
	}
	fresh := t.TempDir()
	writeFixture(t, fresh)
	g := marshalWant(t, fixtureWant{Table: metastoretest.BoltContents(t, filepath.Join(fresh, tableName))})
	if w := marshalWant(t, fixtureWant{Table: want.Table}); string(g) != string(w) {
		t.Errorf("the workload writes the table\n%s\nwant\n%s", g, w)
	}
	// The ranks' page store manifests (store.db) and disk tier indexes
	// (index.db), written by the same older code, are written the same
	// too.
	slots := map[string]int{}
	for _, r := range []Rank{{CP: 0}, {CP: 1}} {
		for _, name := range []string{"store.db", "index.db"} {
			path := filepath.Join(RankDir(fixtureDir, r), name)
			old, now := metastoretest.BoltContents(t, path), metastoretest.BoltContents(t, filepath.Join(RankDir(fresh, r), name))
			if len(old["meta"]) == 0 {
				t.Fatalf("%s holds no format record", path)
			}
			slots[name] += len(old["slots"])
			if name == "store.db" {
				// Summary records (sums/<slot>) came after the
				// fixture and only a VerifyOnRead store writes them
				// (the worker's stores verify at open): none here.
				if len(now["sums"]) != 0 {
					t.Errorf("rank %v: %d summary records written by a store that verifies at open", r, len(now["sums"]))
				}
				delete(now, "sums")
			}
			if !reflect.DeepEqual(old, now) {
				t.Errorf("rank %v: the workload writes %s\n%q\nwant (%s)\n%q", r, name, now, path, old)
			}
		}
	}
	if slots["store.db"] == 0 || slots["index.db"] == 0 {
		t.Fatalf("the fixture's page stores hold %v slot records: none to compare", slots)
	}
}
