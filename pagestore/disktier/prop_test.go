package disktier_test

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/questrt/questrt/pagestore/disktier"
	"github.com/questrt/questrt/pagestore/tier"
	"github.com/questrt/questrt/pagestore/tier/tiertest"
)

// Operations of the model test.
const (
	opWrite = iota
	opRead
	opFree
	opReopen // Close, Open
	opCrash  // open a copy of the directory, taken while open
	opSync
	numOps
)

// A model slot: empty (0), holding payload generation g (g > 0), or
// corrupt (-1).
const (
	slotEmpty   = 0
	slotCorrupt = -1
)

// model runs operations on a disk tier and on a map model side by side.
type model struct {
	t     testing.TB
	cfg   disktier.Config
	tr    *disktier.Tier
	state []int // per slot: slotEmpty, slotCorrupt or a generation
	// flushed is the state at the last flush (Sync, Reopen, Crash) and
	// since the slots written after it; they decide a crash image's
	// state outside SyncOnWrite.
	flushed []int
	since   []bool
	gen     int
	dst     []byte
}

func newModel(t testing.TB, d disktier.Durability, slots, size, align int) *model {
	c := testConfig(t.TempDir(), slots, size)
	c.Durability = d
	c.SlotAlign = align
	c.SyncInterval = 1 << 62 // SyncPeriodic: no timer flush during the test
	m := &model{t: t, cfg: c, state: make([]int, slots), flushed: make([]int, slots),
		since: make([]bool, slots), dst: make([]byte, size)}
	m.open()
	return m
}

func (m *model) open() {
	tr, err := disktier.Open(m.cfg)
	if err != nil {
		m.t.Fatalf("open %s: %v", m.cfg.Dir, err)
	}
	m.tr = tr
	m.t.Cleanup(func() { _ = tr.Close() })
	copy(m.flushed, m.state)
	clear(m.since)
}

func (m *model) payload(slot, gen int) []byte { return tiertest.Payload(slot, gen, m.cfg.PayloadBytes) }

// step runs one operation; it reports a mismatch through m.t.
func (m *model) step(op, slot int) {
	t := m.t
	ctx := ctxT(t)
	switch op {
	case opWrite:
		m.gen++
		if err := m.tr.Write(ctx, slot, m.payload(slot, m.gen)); err != nil {
			t.Fatalf("write slot %d: %v", slot, err)
		}
		m.state[slot] = m.gen
		m.since[slot] = true
	case opRead:
		err := m.tr.Read(ctx, slot, m.dst)
		switch g := m.state[slot]; g {
		case slotEmpty:
			if !errors.Is(err, tier.ErrEmpty) {
				t.Fatalf("read slot %d: %v, want ErrEmpty", slot, err)
			}
		case slotCorrupt:
			if !errors.Is(err, tier.ErrCorrupt) {
				t.Fatalf("read slot %d: %v, want ErrCorrupt", slot, err)
			}
		default:
			if err != nil || !bytes.Equal(m.dst, m.payload(slot, g)) {
				t.Fatalf("read slot %d: %v (equal %v), want generation %d", slot, err, bytes.Equal(m.dst, m.payload(slot, g)), g)
			}
		}
	case opFree:
		err := m.tr.Free(ctx, slot)
		if m.state[slot] == slotEmpty {
			if !errors.Is(err, tier.ErrEmpty) {
				t.Fatalf("free empty slot %d: %v, want ErrEmpty", slot, err)
			}
			return
		}
		if err != nil {
			t.Fatalf("free slot %d: %v", slot, err)
		}
		m.state[slot] = slotEmpty
	case opReopen:
		if err := m.tr.Close(); err != nil {
			t.Fatalf("close: %v", err)
		}
		m.open()
	case opCrash:
		img := copyDir(t, m.cfg.Dir)
		if err := m.tr.Close(); err != nil {
			t.Fatalf("close: %v", err)
		}
		m.cfg.Dir = img
		if m.cfg.Durability != disktier.SyncOnWrite {
			// The index is that of the last flush; a slot written
			// since has new bytes under the flushed checksum.
			for s := range m.state {
				m.state[s] = m.flushed[s]
				if m.since[s] && m.flushed[s] != slotEmpty {
					m.state[s] = slotCorrupt
				}
			}
		}
		m.open()
	case opSync:
		if err := m.tr.Sync(ctx); err != nil {
			t.Fatalf("sync: %v", err)
		}
		copy(m.flushed, m.state)
		clear(m.since)
	}
}

// check reads every slot and compares Used with the model.
func (m *model) check() {
	used := m.tr.Used()
	var want []int
	for s := range m.state {
		m.step(opRead, s)
		if m.state[s] != slotEmpty {
			want = append(want, s)
		}
	}
	if fmt.Sprint(used) != fmt.Sprint(want) {
		m.t.Fatalf("Used = %v, model %v", used, want)
	}
}

var durabilities = []disktier.Durability{disktier.SyncOnWrite, disktier.SyncPeriodic, disktier.SyncNone}

// TestModel runs random operation sequences against the model in every
// durability mode.
func TestModel(t *testing.T) {
	const slots, size, steps = 7, 300, 250
	for _, d := range durabilities {
		for seed := range uint64(3) {
			t.Run(fmt.Sprintf("%v/seed%d", d, seed), func(t *testing.T) {
				r := rand.New(rand.NewPCG(seed, uint64(d)))
				align := []int{1, 512, 4096}[r.IntN(3)]
				m := newModel(t, d, slots, size, align)
				weights := []int{opWrite, opWrite, opWrite, opRead, opRead, opFree, opFree, opSync, opReopen, opCrash}
				for range steps {
					m.step(weights[r.IntN(len(weights))], r.IntN(slots))
				}
				m.check()
				m.step(opReopen, 0)
				m.check()
			})
		}
	}
}

// FuzzModel decodes operations from the input: the first byte picks the
// durability, then each pair of bytes is (operation, slot).
func FuzzModel(f *testing.F) {
	f.Add([]byte{0, opWrite, 1, opRead, 1, opFree, 1, opRead, 1})
	f.Add([]byte{1, opWrite, 0, opSync, 0, opWrite, 0, opCrash, 0, opRead, 0, opFree, 0, opReopen, 0, opRead, 0})
	f.Add([]byte{2, opWrite, 2, opWrite, 3, opSync, 0, opFree, 2, opWrite, 4, opCrash, 0, opWrite, 2, opRead, 2})
	f.Add([]byte{0, opWrite, 5, opCrash, 0, opFree, 5, opReopen, 0, opRead, 5})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < 1 || len(data) > 81 {
			return
		}
		const slots = 6
		m := newModel(t, durabilities[int(data[0])%len(durabilities)], slots, 64, 1)
		for i := 1; i+1 < len(data); i += 2 {
			m.step(int(data[i])%numOps, int(data[i+1])%slots)
		}
		m.check()
	})
}
