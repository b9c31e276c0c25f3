package eval

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
)

// TaskReversal names the relevance-reversal prompts of Reversal.
const TaskReversal = "reversal"

// DefaultReversalRepeats is how often a reversal prompt states the
// distractor's fact by default.
const DefaultReversalRepeats = 8

// Alignments of Reversal: how the answer's first digit is moved to its
// in-page offset.
const (
	// AlignBlock (the default) keeps the trained format: facts only at
	// boundaries of the filler block (PasskeyFiller, 5 sentences, 90
	// bytes). B's fact goes to the block boundary nearest the depth that
	// gives the offset, either alone or right after A's first statement
	// (the two entities side by side), which shifts it by the length of
	// A's fact (one of the Repeats statements, so only with Repeats >
	// 1). As 90 is even, with an even page size B alone reaches the
	// offsets of one parity and B after A's fact (45 bytes for a
	// five-letter name, 43 for Bob) the other; A is the name that puts B
	// nearest the depth (ties in a random order). Page sizes sharing a
	// larger factor with 90 (12, say) leave offsets unreachable: an
	// error.
	AlignBlock = "block"
	// AlignSentence inserts B's fact at any sentence start of the
	// filler, inside a block too. The text stays filler sentences and
	// facts, but the test checkpoints only know facts between blocks:
	// single-key prompts with the fact inside a block take
	// passkey-llama-v1 and -v2 from 100% to 2.5% (dense, 2K, n = 40).
	AlignSentence = "sentence"
	// AlignPad puts B's fact at the block boundary nearest the depth
	// and 0..S-1 spaces before it (single-key prompts with 1..15 spaces:
	// v1 45%, v2 70%, dense, 2K, n = 40).
	AlignPad = "pad"
)

// ReversalOptions shape relevance-reversal prompts (notes 3.3): two
// named facts, the answer B's stated once early, the distractor A's
// repeated over the rest of the filler so that the history of attention
// favours A, then the question asks for B.
type ReversalOptions struct {
	// PageSize is S, the KV page size the offset refers to (0: 16).
	PageSize int
	// Offset is where B's first digit falls in its page: "start" (token
	// offset 0), "middle" (S/2), "end" (S-1), a token offset 0..S-1, or
	// "any" (no alignment: the fact at the filler-block boundary nearest
	// the depth, exactly the trained format). "" is "start".
	Offset string
	// Align is AlignBlock ("" too), AlignSentence or AlignPad; unused
	// with "any".
	Align string
	// Repeats is how often A's fact is stated (0: 8).
	Repeats int
	// Depth is the depth in [0, 1) B's fact is aimed at (it moves to
	// the nearest insertion point giving the offset; Prompt.Depths[0] is
	// where it went). Negative: uniform in [0.05, 0.35).
	Depth float64
}

// ResolveOffset returns the in-page token offset a ReversalOptions.Offset
// names for page size s ("any": -1).
func ResolveOffset(name string, s int) (int, error) {
	if s < 1 {
		return 0, fmt.Errorf("reversal: page size %d < 1", s)
	}
	switch name {
	case "", "start":
		return 0, nil
	case "middle":
		return s / 2, nil
	case "end":
		return s - 1, nil
	case "any":
		return -1, nil
	}
	o, err := strconv.Atoi(name)
	if err != nil || o < 0 || o >= s {
		return 0, fmt.Errorf("reversal: offset %q: want start, middle, end, any or a token offset in 0..%d", name, s-1)
	}
	return o, nil
}

// Reversal builds a relevance-reversal prompt of about length bytes in
// the multi-key format of Passkey: the intro, filler blocks, B's fact
// "The pass key of B is NNNNN. Remember it. " near opt.Depth, A's fact
// (another name, another code) opt.Repeats times at filler-block
// boundaries from just after B's fact to the end of the context (the
// last one right before the question; with AlignBlock the first may sit
// right before B's), and the question "What is the pass key of B? The
// pass key of B is ". The answer is B's code.
//
// Token positions count the BOS token the harness prepends: the byte at
// offset i of the context is token i+1. B's fact is placed so that the
// first digit of its code is token AnswerToken with AnswerToken mod S
// the requested offset (see AlignBlock, AlignSentence, AlignPad).
// Prompt.Depths are B's depth, then A's in order, as fractions of the
// filler (the depth of Passkey).
func Reversal(rng *rand.Rand, length int, opt ReversalOptions) (Prompt, error) {
	s := opt.PageSize
	if s == 0 {
		s = 16
	}
	if s < 1 {
		return Prompt{}, fmt.Errorf("reversal: page size %d < 1", s)
	}
	off, err := ResolveOffset(opt.Offset, s)
	if err != nil {
		return Prompt{}, err
	}
	label := opt.Offset
	if label == "" {
		label = "start"
	}
	align := opt.Align
	switch align {
	case "":
		align = AlignBlock
	case AlignBlock, AlignSentence, AlignPad:
	default:
		return Prompt{}, fmt.Errorf("reversal: alignment %q (want %s, %s or %s)", opt.Align, AlignBlock, AlignSentence, AlignPad)
	}
	reps := opt.Repeats
	if reps == 0 {
		reps = DefaultReversalRepeats
	}
	if reps < 0 {
		return Prompt{}, fmt.Errorf("reversal: %d repeats", reps)
	}
	depth := opt.Depth
	switch {
	case math.IsNaN(depth) || depth >= 1:
		return Prompt{}, fmt.Errorf("reversal: depth %v outside [0, 1)", depth)
	case depth < 0:
		depth = 0.05 + 0.3*rng.Float64()
	}
	// B, then A among the other names: the one whose fact puts B
	// nearest the depth (ties: a random order), and two distinct codes.
	ib := rng.IntN(len(passkeyNames))
	nameB := passkeyNames[ib]
	codeB := fmt.Sprint(10000 + rng.IntN(90000))
	codeA := codeB
	for codeA == codeB {
		codeA = fmt.Sprint(10000 + rng.IntN(90000))
	}
	var nameA string
	var lay reversalLayout
	for _, i := range rng.Perm(len(passkeyNames)) {
		if i == ib {
			continue
		}
		l, ok := layReversal(length, s, off, align, reps, depth, passkeyNames[i], nameB)
		if ok && (nameA == "" || l.drift < lay.drift) {
			nameA, lay = passkeyNames[i], l
		}
	}
	if nameA == "" {
		return Prompt{}, fmt.Errorf("reversal: no %s insertion point in a %d-byte prompt puts the answer at offset %d of a %d-token page (a longer prompt, or another alignment)", align, length, off, s)
	}
	factA, factB := namedFact(nameA, codeA), namedFact(nameB, codeB)
	fl, fillers, cut := len(PasskeyFiller), lay.fillers, lay.cut
	// A's statements after B's fact: evenly over the block boundaries
	// from the first one after it to the end.
	after := reps
	if lay.before {
		after--
	}
	first := min(cut/fl+1, fillers)
	at := make([]int, after)
	for i := range after {
		at[i] = fillers
		if after > 1 {
			at[i] = first + int(float64(fillers-first)*float64(i)/float64(after-1)+0.5)
		}
	}
	filler := strings.Repeat(PasskeyFiller, fillers)
	var b strings.Builder
	b.WriteString(PasskeyIntro)
	b.WriteString(filler[:cut])
	b.WriteString(strings.Repeat(" ", lay.pad))
	depths := []float64{frac(cut, fillers*fl)}
	if lay.before {
		b.WriteString(factA)
		depths = append(depths, depths[0])
	}
	answer := b.Len() + len(namedFactPrefix(nameB)) + 1
	b.WriteString(factB)
	pos := cut // filler bytes written
	for _, k := range at {
		b.WriteString(filler[pos : k*fl])
		pos = k * fl
		b.WriteString(factA)
		depths = append(depths, frac(k, fillers))
	}
	b.WriteString(filler[pos:])
	return Prompt{Context: b.String(), Question: namedQuestion(nameB), Answer: codeB, Length: length, Depths: depths,
		Task: TaskReversal, Offset: label, AnswerToken: answer, Distractor: codeA}, nil
}

// reversalLayout is where Reversal puts B's fact: after cut bytes of
// fillers filler blocks, after pad spaces, and after A's first fact when
// before.
type reversalLayout struct {
	fillers, cut, pad int
	before            bool
	drift             float64 // |cut - the depth's byte|
}

// layReversal places B's fact for the names (ok false: no insertion
// point gives the offset).
func layReversal(length, s, off int, align string, reps int, depth float64, nameA, nameB string) (reversalLayout, bool) {
	fl := len(PasskeyFiller)
	factA := len(namedFact(nameA, "00000"))
	fixed := len(PasskeyIntro) + len(namedQuestion(nameB)) + len(namedFact(nameB, "00000")) + reps*factA
	if align == AlignPad && off >= 0 {
		fixed += (s - 1) / 2
	}
	l := reversalLayout{fillers: max((length-fixed+fl/2)/fl, 0)}
	// lead+c is the token position of B's first digit when B's fact
	// follows c bytes of filler.
	lead := 1 + len(PasskeyIntro) + len(namedFactPrefix(nameB))
	want := depth * float64(l.fillers*fl)
	nearest := int(depth*float64(l.fillers)+0.5) * fl
	best := math.Inf(1)
	try := func(c, shift int, before bool) {
		if d := math.Abs(float64(c) - want); (lead+c+shift)%s == off && (d < best || d == best && c < l.cut) {
			best, l.cut, l.before = d, c, before
		}
	}
	switch {
	case off < 0:
		l.cut = nearest
		l.drift = math.Abs(float64(l.cut) - want)
		return l, true
	case align == AlignPad:
		l.cut = nearest
		l.pad = ((off-(lead+l.cut))%s + s) % s
		l.drift = math.Abs(float64(l.cut) - want)
		return l, true
	case align == AlignBlock:
		// B's fact before the last block boundary, so that A's follow it.
		for k := range l.fillers {
			try(k*fl, 0, false)
			if reps > 1 { // one of A's statements stays after B's
				try(k*fl, factA, true)
			}
		}
	default:
		for i := 0; i < fl; {
			for k := range l.fillers {
				try(k*fl+i, 0, false)
			}
			j := strings.Index(PasskeyFiller[i:], ". ")
			if j < 0 {
				break
			}
			i += j + 2
		}
	}
	l.drift = best
	return l, !math.IsInf(best, 1)
}
