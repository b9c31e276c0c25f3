package memlimit

import (
	"context"
	"errors"
	"testing"
)

type fakeDevice struct {
	free, total int64
	err         error
}

func (d fakeDevice) MemInfo(context.Context) (int64, int64, error) { return d.free, d.total, d.err }

// TestDeviceBudget: vLLM's rule on an 80 GB device with 16 GB used (the
// weights and workspace): 0.9 leaves 0.9 x 80 - 16 = 56 GB; with another
// process holding 20 GB more, 0.99 leaves 79.2 - 36 = 43.2 GB and 1 all
// 44 GB free; a fraction below what is used gives 0; Fit counts whole
// units after the fixed bytes.
func TestDeviceBudget(t *testing.T) {
	const gb = int64(1e9)
	ctx := context.Background()
	b, err := ReadDevice(ctx, fakeDevice{free: 64 * gb, total: 80 * gb}, 0.9)
	if err != nil || b.Bytes != 56*gb || b.Free != 64*gb || b.Total != 80*gb || b.Fraction != 0.9 {
		t.Fatalf("0.9 of 80 GB with 64 GB free: %+v, %v; want 56 GB", b, err)
	}
	if b := NewDeviceBudget(44*gb, 80*gb, 0.99); b.Bytes != 432e8 {
		t.Errorf("0.99 of 80 GB with 44 GB free: %+v, want 43.2 GB", b)
	}
	if b := NewDeviceBudget(44*gb, 80*gb, 1); b.Bytes != 44*gb {
		t.Errorf("all of 80 GB with 44 GB free: %+v, want 44 GB", b)
	}
	if b := NewDeviceBudget(10*gb, 80*gb, 0.5); b.Bytes != 0 {
		t.Errorf("0.5 of 80 GB with 70 GB used: %+v, want 0", b)
	}
	// 56 GB after 1 GB fixed in units of 3 GB: 18 (55 / 3 = 18.33).
	b, _ = ReadDevice(ctx, fakeDevice{free: 64 * gb, total: 80 * gb}, 0.9)
	if n := b.Fit(gb, 3*gb); n != 18 {
		t.Errorf("Fit(1 GB, 3 GB) of 56 GB = %d, want 18", n)
	}
	if n := b.Fit(57*gb, 1); n != 0 {
		t.Errorf("Fit past the budget = %d, want 0", n)
	}
	for _, f := range []float64{0, -0.5, 1.01} {
		if _, err := ReadDevice(ctx, fakeDevice{free: gb, total: gb}, f); err == nil {
			t.Errorf("fraction %v accepted", f)
		}
	}
	boom := errors.New("no device")
	if _, err := ReadDevice(ctx, fakeDevice{err: boom}, 0.9); !errors.Is(err, boom) {
		t.Errorf("MemInfo's failure: %v", err)
	}
}
