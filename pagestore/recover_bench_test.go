package pagestore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/questrt/questrt/plan"
)

// BenchmarkOpen opens (New) and closes a data directory of N sealed
// pages (8 sequences; 2 layers, 4 KV heads, D = 128, S = 16: a 128 KiB
// payload and an 8 KiB summary record per page) with each Verify mode.
// payload-B/open is the page payload bytes read by the open
// (RecoveryReport.PayloadBytesRead); the slabs are in the page cache
// after the first iteration, so ns/op is the CPU side of an open (a
// cold open adds the device's time to read payload-B/open).
func BenchmarkOpen(b *testing.B) {
	for _, n := range []int{256, 2048} {
		dir := b.TempDir()
		c := Config{
			Layers:   2,
			Geometry: plan.Geometry{QHeads: 16, KVHeads: 4, HeadDim: 128, PageSize: 16, DType: plan.Float32},
			Capacity: n, MemoryLimit: -1, DataDir: dir, Durability: SyncPeriodic,
			// Written as a VerifyOnRead deployment writes it: with a
			// summary record per slot (a VerifyAtOpen store writes none).
			Verify: VerifyOnRead, ScrubRate: -1,
		}
		s, err := New(c)
		if err != nil {
			b.Fatal(err)
		}
		rng := rand.New(rand.NewPCG(1, 2))
		tok := c.KVHeads * c.HeadDim
		k, v := make([]float32, 16*tok), make([]float32, 16*tok)
		for i := range k {
			k[i], v[i] = rng.Float32(), rng.Float32()
		}
		for q := range 8 {
			id := s.Create()
			for range n / 8 {
				for l := range c.Layers {
					if err := s.Append(id, l, k, v); err != nil {
						b.Fatal(err)
					}
				}
			}
			_ = q
		}
		if err := s.Close(); err != nil {
			b.Fatal(err)
		}
		for _, cold := range []bool{false, true} {
			for _, mode := range []Verify{VerifyAtOpen, VerifyOnRead} {
				cache := "warm"
				if cold {
					cache = "cold"
				}
				b.Run(fmt.Sprintf("pages=%d/cache=%s/verify=%v", n, cache, mode), func(b *testing.B) {
					benchOpen(b, c, mode, cold)
				})
			}
		}
	}
}

func benchOpen(b *testing.B, c Config, mode Verify, cold bool) {
	n := c.Capacity
	c.Verify, c.ScrubRate = mode, -1
	var read int64
	for b.Loop() {
		if cold {
			b.StopTimer()
			dropCache(b, c.DataDir)
			b.StartTimer()
		}
		s, err := New(c)
		if err != nil {
			b.Fatal(err)
		}
		r := s.Recovery()
		if r.Pages != n || len(r.Damaged) != 0 {
			b.Fatalf("recovered %d pages, %d damaged", r.Pages, len(r.Damaged))
		}
		read = r.PayloadBytesRead
		b.StopTimer()
		if err := s.Close(); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.ReportMetric(float64(read), "payload-B/open")
	st, err := os.Stat(filepath.Join(c.DataDir, storeDBName))
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(st.Size()), "store.db-B")
}

// dropCache asks the kernel to drop the page cache of dir's files
// (theirs only: posix_fadvise DONTNEED after an fsync), so that the
// next open reads them from the device.
func dropCache(b *testing.B, dir string) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		b.Fatal(err)
	}
	for _, e := range ents {
		f, err := os.Open(filepath.Join(dir, e.Name()))
		if err != nil {
			b.Fatal(err)
		}
		_ = f.Sync()
		if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
			b.Fatal(err)
		}
		f.Close()
	}
}

// BenchmarkSave is what the summary records cost the writes: a fresh
// data directory (2 layers, 4 KV heads, D = 128, S = 16, as
// BenchmarkOpen), N pages appended in 8 sequences and then made durable
// (Sync with SyncPeriodic, every seal fsynced with SyncOnWrite), with
// each Verify mode: VerifyOnRead writes a summary record (8 KiB here)
// with every slot record, VerifyAtOpen none. The New and Close around
// the appends are not timed. B/page is the page payload and summary
// record bytes the store was asked to write per page; cpu-ms/op the
// process's user and system CPU time of the timed part (steadier than
// ns/op on a shared machine, where the fsyncs' wait varies most).
func BenchmarkSave(b *testing.B) {
	for _, n := range []int{256, 1024} {
		for _, dur := range []Durability{SyncPeriodic, SyncOnWrite} {
			for _, mode := range []Verify{VerifyAtOpen, VerifyOnRead} {
				name := fmt.Sprintf("pages=%d/durability=%v/verify=%v", n, dur, mode)
				b.Run(name, func(b *testing.B) { benchSave(b, n, dur, mode) })
			}
		}
	}
}

func benchSave(b *testing.B, n int, dur Durability, mode Verify) {
	c := Config{
		Layers:   2,
		Geometry: plan.Geometry{QHeads: 16, KVHeads: 4, HeadDim: 128, PageSize: 16, DType: plan.Float32},
		Capacity: n, MemoryLimit: -1, Durability: dur, Verify: mode, ScrubRate: -1,
	}
	rng := rand.New(rand.NewPCG(1, 2))
	tok := c.KVHeads * c.HeadDim
	k, v := make([]float32, 16*tok), make([]float32, 16*tok)
	for i := range k {
		k[i], v[i] = rng.Float32(), rng.Float32()
	}
	var perPage int64
	var cpu time.Duration
	for b.Loop() {
		b.StopTimer()
		c.DataDir = b.TempDir()
		s, err := New(c)
		if err != nil {
			b.Fatal(err)
		}
		cpu0 := cpuTime(b)
		b.StartTimer()
		for range 8 {
			id := s.Create()
			for range n / 8 {
				for l := range c.Layers {
					if err := s.Append(id, l, k, v); err != nil {
						b.Fatal(err)
					}
				}
			}
		}
		if err := s.Sync(context.Background()); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		cpu += cpuTime(b) - cpu0
		perPage = int64(c.PayloadBytes())
		if mode == VerifyOnRead {
			perPage += int64(s.sumLen())
		}
		if err := s.Close(); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.ReportMetric(float64(perPage), "B/page")
	b.ReportMetric(float64(cpu.Milliseconds())/float64(b.N), "cpu-ms/op")
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime(b *testing.B) time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
