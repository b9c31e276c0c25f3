package metastore

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
)

// MemManifests is the in-memory twin of a bbolt manifests file, as Mem
// is of a sequence table: what is committed stays across Close, and its
// lock is a file's. It is safe for concurrent use.
type MemManifests struct {
	mu        sync.Mutex
	lock      memLock
	format    []byte
	nextID    uint64
	manifests map[uint64]Manifest
	slots     map[int32]uint32
	sums      map[int32][]byte
}

// NewMemManifests returns empty MemManifests.
func NewMemManifests() *MemManifests {
	return &MemManifests{manifests: map[uint64]Manifest{}, slots: map[int32]uint32{}, sums: map[int32][]byte{}}
}

// Open opens the manifests.
func (m *MemManifests) Open(opt Options) (Manifests, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	h, err := openMem(&m.mu, &m.lock, opt.ReadOnly)
	if err != nil {
		return nil, fmt.Errorf("metastore: memory manifests: %w", err)
	}
	return &memManifests{memHandle: h, m: m}, nil
}

// memManifests is one open of a MemManifests.
type memManifests struct {
	memHandle
	m *MemManifests
}

func (t *memManifests) Init(ctx context.Context, f ManifestFormat) error {
	want := encodeManifestFormat(f)
	if err := t.enter(ctx, true); err != nil {
		return err
	}
	defer t.m.mu.Unlock()
	if t.m.format != nil && !bytes.Equal(t.m.format, want) {
		return &FormatError{Have: bytes.Clone(t.m.format), Want: want}
	}
	t.m.format = want
	return nil
}

func (t *memManifests) Load(ctx context.Context) (Loaded, error) {
	if err := t.enter(ctx, false); err != nil {
		return Loaded{}, err
	}
	defer t.m.mu.Unlock()
	out := Loaded{NextID: t.m.nextID, SlotCRC: map[int32]uint32{}, BadSlots: map[int32]error{}}
	for _, man := range t.m.manifests {
		out.Manifests = append(out.Manifests, ManifestRecord{Manifest: cloneManifest(man)})
	}
	slices.SortFunc(out.Manifests, func(a, b ManifestRecord) int { return cmp.Compare(a.Manifest.ID, b.Manifest.ID) })
	for sl, crc := range t.m.slots {
		out.SlotCRC[sl] = crc
	}
	for sl, sum := range t.m.sums {
		if out.Summaries == nil {
			out.Summaries = map[int32][]byte{}
		}
		out.Summaries[sl] = bytes.Clone(sum)
	}
	return out, nil
}

func (t *memManifests) Commit(ctx context.Context, b ManifestBatch) error {
	if err := t.enter(ctx, true); err != nil {
		return err
	}
	defer t.m.mu.Unlock()
	if t.m.format == nil {
		return fmt.Errorf("metastore: commit manifests before Init")
	}
	for sl, crc := range b.SlotCRC {
		t.m.slots[sl] = crc
		if sum, ok := b.Summaries[sl]; ok {
			t.m.sums[sl] = bytes.Clone(sum)
		} else {
			delete(t.m.sums, sl)
		}
	}
	for _, man := range b.Put {
		t.m.manifests[man.ID] = cloneManifest(man)
	}
	for _, id := range b.Delete {
		delete(t.m.manifests, id)
	}
	if b.RetainSlots != nil {
		for sl := range t.m.slots {
			if !b.RetainSlots[sl] {
				delete(t.m.slots, sl)
				delete(t.m.sums, sl)
			}
		}
	}
	if b.NextID != 0 {
		t.m.nextID = b.NextID
	}
	return nil
}

func cloneManifest(m Manifest) Manifest {
	m.Lens, m.Slots = slices.Clone(m.Lens), slices.Clone(m.Slots)
	return m
}
