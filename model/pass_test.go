package model

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"testing"
)

// TestPassEqualsForward: a prompt prefilled in chunks whose layers run
// a few at a time (Pass, k layers a call, other sequences' passes in
// between) gives Forward's logits and keys and values bit for bit, for
// every k and chunking, one-token chunks (the decode path) included.
func TestPassEqualsForward(t *testing.T) {
	m := loadTiny(t, F32, 1)
	ctx := context.Background()
	ids := make([]int, 90)
	for i := range ids {
		ids[i] = (i*37 + 11) % 256
	}
	for _, chunks := range [][]int{{90}, {1, 1, 7, 16, 17, 48}, {33, 1, 56}} {
		ref := NewDense(m.Geometry(), 0)
		var want [][]float32
		at := 0
		for _, n := range chunks {
			l, err := m.Forward(ctx, ref, ids[at:at+n], ForwardOptions{})
			if err != nil {
				t.Fatal(err)
			}
			want = append(want, l)
			at += n
		}
		for _, k := range []int{1, 2, 5} {
			t.Run(fmt.Sprintf("chunks=%v/layers=%d", chunks, k), func(t *testing.T) {
				got := NewDense(m.Geometry(), 0)
				other := NewDense(m.Geometry(), 0) // another sequence's passes in between
				at := 0
				for c, n := range chunks {
					p, err := m.StartPass(got, ids[at:at+n])
					if err != nil {
						t.Fatal(err)
					}
					if p.Tokens() != n || p.Left() != m.Config.Layers {
						t.Fatalf("pass of %d tokens, %d layers left; want %d and %d", p.Tokens(), p.Left(), n, m.Config.Layers)
					}
					for p.Left() > 0 {
						if _, err := p.Logits(); err == nil {
							t.Fatal("logits before the last layer")
						}
						if err := p.Run(ctx, k); err != nil {
							t.Fatal(err)
						}
						if _, err := m.Forward(ctx, other, ids[c:c+1], ForwardOptions{}); err != nil {
							t.Fatal(err)
						}
					}
					l, err := p.Logits()
					if err != nil {
						t.Fatal(err)
					}
					if !bitsEqual(l, want[c]) {
						t.Fatalf("chunk %d: logits differ from Forward's", c)
					}
					at += n
				}
				for li := range m.Config.Layers {
					gk, gv := got.KV(li)
					wk, wv := ref.KV(li)
					if !bitsEqual(gk, wk) || !bitsEqual(gv, wv) {
						t.Fatalf("layer %d: keys or values differ from Forward's", li)
					}
				}
			})
		}
	}
}

// TestPassChecks: a pass over bad input or past the positions is
// refused as Forward refuses it, and a cancelled context stops it.
func TestPassChecks(t *testing.T) {
	m := loadTiny(t, F32, 1)
	d := NewDense(m.Geometry(), 0)
	for _, ids := range [][]int{nil, {1, 999}, make([]int, 5000)} {
		if _, err := m.StartPass(d, ids); !errors.Is(err, ErrBadInput) {
			t.Errorf("pass over %d tokens: %v, want ErrBadInput", len(ids), err)
		}
	}
	p, err := m.StartPass(d, []int{1, 2, 3})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := p.Run(ctx, 1); !errors.Is(err, context.Canceled) {
		t.Errorf("run after cancel: %v, want context.Canceled", err)
	}
}

func bitsEqual(a, b []float32) bool {
	return slices.EqualFunc(a, b, func(x, y float32) bool { return math.Float32bits(x) == math.Float32bits(y) })
}
