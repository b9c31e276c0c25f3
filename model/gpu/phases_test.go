package gpu

import (
	"context"
	"testing"
)

// TestLayerWeightBytes: the decoder layers' weight bytes (what the bench
// decode's proj_GBps divides by) are every layer matrix's rows x columns
// x element size, and the weights' bytes those plus the embedding, the
// final norm and the head.
func TestLayerWeightBytes(t *testing.T) {
	ctx := context.Background()
	x, err := NewRandom(ctx, twin(t), tinyConfig(t), 3, Options{MaxBatch: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close(ctx)
	var layers int64
	for i := range x.layers {
		for _, m := range x.layers[i].matrices() {
			layers += int64(m.Rows) * int64(m.Cols) * int64(m.DType.Bytes())
		}
	}
	if got := x.LayerWeightBytes(); got != layers || layers == 0 {
		t.Errorf("LayerWeightBytes %d, by hand %d", got, layers)
	}
	if got, want := x.WeightBytes(), layers+x.embed.Bytes()+x.norm.Bytes()+x.head.Bytes(); got != want {
		t.Errorf("WeightBytes %d, want %d", got, want)
	}
}
