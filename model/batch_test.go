package model

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/questrt/questrt/plan"
)

// sameBits reports the first index where got and want differ in their
// float32 bits (-1: none).
func sameBits(got, want []float32) int {
	if len(got) != len(want) {
		return 0
	}
	for i := range got {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			return i
		}
	}
	return -1
}

// batchTwins returns, for each prompt length, two sequences prefilled
// alike by mk: one decoded in batches, one by Forward alone.
func batchTwins(t *testing.T, m *Model, mk func(i int) Attention, lens []int, rng *rand.Rand) (batch, alone []Attention, first []int) {
	t.Helper()
	ctx := context.Background()
	for i, n := range lens {
		ids := randTokens(rng, n)
		a, b := mk(i), mk(i)
		la, err := m.Forward(ctx, a, ids, ForwardOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := m.Forward(ctx, b, ids, ForwardOptions{}); err != nil {
			t.Fatal(err)
		}
		batch, alone, first = append(batch, a), append(alone, b), append(first, Argmax(la))
	}
	return batch, alone, first
}

// TestDecodeBatchBitIdentical: decode steps of sequences of different
// lengths run as one batch give, bit for bit, the logits of each
// sequence's one-token Forward on a twin sequence, for every Attention
// (the engine's with sparse plans and a per-sequence budget), through
// steps where sequences join and leave the batch.
func TestDecodeBatchBitIdentical(t *testing.T) {
	m := loadTiny(t, BF16, 1)
	ctx := context.Background()
	p := plan.DefaultPolicy()
	p.DenseLayers = 0
	p.BudgetTokens = 32 // two pages of 16: sparse past 32 tokens
	lens := []int{1, 15, 16, 17, 40, 90}
	impls := map[string]func(i int) Attention{
		"reference": func(int) Attention { return NewReference(m.Geometry()) },
		"dense":     func(int) Attention { return NewDense(m.Geometry(), 2) },
		"engine": func(i int) Attention {
			a, err := NewEngineAttention(newEngine(t, m, p, 256, 1, 1), m.Geometry())
			if err != nil {
				t.Fatal(err)
			}
			a.Budget = []int{0, 16, 32, 48, 0, 64}[i]
			return a
		},
	}
	for name, mk := range impls {
		t.Run(name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(11, 11))
			batch, alone, next := batchTwins(t, m, mk, lens, rng)
			for step := range 12 {
				// Sequence i is in the batch at steps where (step+i)%4
				// != 3: members change from step to step.
				var idx []int
				for i := range batch {
					if (step+i)%4 != 3 {
						idx = append(idx, i)
					}
				}
				attns, toks := make([]Attention, len(idx)), make([]int, len(idx))
				for j, i := range idx {
					attns[j], toks[j] = batch[i], next[i]
				}
				got, err := m.DecodeBatch(ctx, attns, toks)
				if err != nil {
					t.Fatal(err)
				}
				for j, i := range idx {
					want, err := m.Forward(ctx, alone[i], []int{next[i]}, ForwardOptions{})
					if err != nil {
						t.Fatal(err)
					}
					if at := sameBits(got[j], want); at >= 0 {
						t.Fatalf("step %d sequence %d (prompt %d): logit %d is %v batched, %v alone", step, i, lens[i], at, got[j][at], want[at])
					}
					if batch[i].Len() != alone[i].Len() {
						t.Fatalf("step %d sequence %d: length %d batched, %d alone", step, i, batch[i].Len(), alone[i].Len())
					}
					next[i] = Argmax(want)
				}
			}
		})
	}
}

// failAt is an Attention whose Decode fails at one layer.
type failAt struct {
	Attention
	layer int
}

var errInjected = errors.New("injected attention failure")

func (f *failAt) Decode(ctx context.Context, layer int, q, k, v, out []float32) error {
	if layer == f.layer {
		return errInjected
	}
	return f.Attention.Decode(ctx, layer, q, k, v, out)
}

// TestDecodeBatchErrors: bad input changes no sequence; a failing
// attention drops only its sequence (a *BatchError naming it) while the
// others decode bit for bit as alone; a done context fails the batch.
func TestDecodeBatchErrors(t *testing.T) {
	m := loadTiny(t, F32, 1)
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(5, 5))
	batch, alone, next := batchTwins(t, m, func(int) Attention { return NewDense(m.Geometry(), 1) }, []int{5, 9, 13}, rng)
	lens := func() []int {
		var l []int
		for _, a := range batch {
			l = append(l, a.Len())
		}
		return l
	}
	before := fmt.Sprint(lens())
	for _, bad := range []struct {
		name  string
		attns []Attention
		toks  []int
	}{
		{"empty", nil, nil},
		{"count mismatch", batch, next[:2]},
		{"token outside vocabulary", batch, []int{next[0], m.Config.VocabSize, next[2]}},
		{"negative token", batch, []int{-1, next[1], next[2]}},
		{"duplicate sequence", []Attention{batch[0], batch[1], batch[0]}, next},
		{"nil attention", []Attention{batch[0], nil, batch[2]}, next},
	} {
		if _, err := m.DecodeBatch(ctx, bad.attns, bad.toks); !errors.Is(err, ErrBadInput) {
			t.Errorf("%s: %v, want ErrBadInput", bad.name, err)
		}
		if got := fmt.Sprint(lens()); got != before {
			t.Fatalf("%s: lengths %s after a refused batch, want %s", bad.name, got, before)
		}
	}
	mp := loadTiny(t, F32, 1)
	mp.Config.MaxPositions = batch[2].Len() // sequence 2's next position is past it
	if _, err := mp.DecodeBatch(ctx, batch, next); !errors.Is(err, ErrBadInput) || fmt.Sprint(lens()) != before {
		t.Errorf("position past max_position_embeddings: %v, lengths %v", err, lens())
	}

	// Sequence 1 fails at layer 1.
	attns := []Attention{batch[0], &failAt{batch[1], 1}, batch[2]}
	got, err := m.DecodeBatch(ctx, attns, next)
	var be *BatchError
	if !errors.As(err, &be) || !errors.Is(err, errInjected) || fmt.Sprint(be.FailedIndices()) != "[1]" {
		t.Fatalf("failing sequence: %v, want a BatchError of index 1", err)
	}
	if got[1] != nil {
		t.Error("the failed sequence has logits")
	}
	for _, i := range []int{0, 2} {
		want, err := m.Forward(ctx, alone[i], []int{next[i]}, ForwardOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if at := sameBits(got[i], want); at >= 0 {
			t.Errorf("sequence %d beside a failure: logit %d differs", i, at)
		}
	}
	all := []Attention{&failAt{batch[0], 0}, &failAt{batch[2], 0}}
	if got, err := m.DecodeBatch(ctx, all, next[:2]); !errors.As(err, &be) || got != nil {
		t.Errorf("every sequence failing: %v, %d logits", err, len(got))
	}

	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := m.DecodeBatch(cctx, batch[:1], next[:1]); !errors.Is(err, context.Canceled) {
		t.Errorf("done context: %v", err)
	}
}

// TestDecodeBatchPasskey: on passkey-llama-v1 with engine attention
// (sparse decode past the budget), a batch of four sequences of
// different lengths generates, bit for bit, each sequence's greedy
// logits alone.
func TestDecodeBatchPasskey(t *testing.T) {
	m, ref := testModel(t, "passkey-llama-v1")
	ctx := context.Background()
	tok, err := NewByteTokenizer(m.Config)
	if err != nil {
		t.Fatal(err)
	}
	p := plan.DefaultPolicy()
	p.BudgetTokens = 128
	full := PromptIDs(tok, ref.Prompt)
	var batch, alone []Attention
	var next []int
	for _, n := range []int{len(full), 300, 161, 33} {
		ids := append(full[:1:1], full[len(full)-n+1:]...)
		for _, dst := range []*[]Attention{&batch, &alone} {
			a, err := NewEngineAttention(newEngine(t, m, p, 1024, 1, 1), m.Geometry())
			if err != nil {
				t.Fatal(err)
			}
			logits, err := m.Forward(ctx, a, ids, ForwardOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if dst == &batch {
				next = append(next, Argmax(logits))
			}
			*dst = append(*dst, a)
		}
	}
	var text []byte
	for step := range 8 {
		got, err := m.DecodeBatch(ctx, batch, next)
		if err != nil {
			t.Fatal(err)
		}
		if step < 5 {
			text = append(text, byte(next[0]))
		}
		for i := range batch {
			want, err := m.Forward(ctx, alone[i], []int{next[i]}, ForwardOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if at := sameBits(got[i], want); at >= 0 {
				t.Fatalf("step %d sequence %d: logit %d is %v batched, %v alone", step, i, at, got[i][at], want[at])
			}
			next[i] = Argmax(want)
		}
	}
	if string(text) != ref.GreedyTxt {
		t.Errorf("greedy continuation %q, reference %q", text, ref.GreedyTxt)
	}
}
