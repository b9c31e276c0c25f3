package eval

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"

	"github.com/questrt/questrt/model"
	"github.com/questrt/questrt/plan"
)

var reversalFact = regexp.MustCompile(`The pass key of ([A-Za-z]+) is ([0-9]{5})\. Remember it\. `)

// TestReversalPrompts checks the prompts against their text alone: the
// token position of B's first digit (found in the text, BOS prepended as
// the harness does) falls at the requested in-page offset, A's fact is
// there Repeats times (at most once before B's, right before it), the
// answer is B's code, the length is close to the one asked for, the
// facts sit where the alignment says, and everything else is the intro
// and the filler.
func TestReversalPrompts(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 3))
	tok := &model.ByteTokenizer{Vocab: 260}
	for _, length := range []int{2048, 8192} {
		for _, s := range []int{8, 16, 32} {
			for _, offset := range []string{"start", "middle", "end", "3", "any", ""} {
				for _, align := range []string{"", AlignBlock, AlignSentence, AlignPad} {
					for _, reps := range []int{0, 1, 3} {
						opt := ReversalOptions{PageSize: s, Offset: offset, Align: align, Repeats: reps, Depth: -1}
						p, err := Reversal(rng, length, opt)
						if err != nil && reps == 1 && align != AlignSentence && align != AlignPad && strings.Contains(err.Error(), "no block insertion point") {
							continue // a single A stays after B: one parity of offsets
						}
						if err != nil {
							t.Fatalf("%d bytes %+v: %v", length, opt, err)
						}
						checkReversal(t, tok, length, opt, p)
					}
				}
			}
		}
	}
}

func checkReversal(t *testing.T, tok model.Tokenizer, length int, opt ReversalOptions, p Prompt) {
	t.Helper()
	s := opt.PageSize
	if s == 0 {
		s = 16
	}
	want := map[string]int{"": 0, "start": 0, "middle": s / 2, "end": s - 1, "3": 3, "any": -1}[opt.Offset]
	reps := opt.Repeats
	if reps == 0 {
		reps = DefaultReversalRepeats
	}
	text := p.Text()
	if d := len(text) - length; d < -len(PasskeyFiller) || d > len(PasskeyFiller)+s {
		t.Errorf("%d bytes %+v: %d bytes", length, opt, len(text))
	}
	if !strings.HasPrefix(text, PasskeyIntro) || p.Task != TaskReversal {
		t.Errorf("%+v: task %q, starts %.40q", opt, p.Task, text)
	}
	q := regexp.MustCompile(`^What is the pass key of ([A-Za-z]+)\? The pass key of ([A-Za-z]+) is $`).FindStringSubmatch(p.Question)
	if q == nil || q[1] != q[2] {
		t.Fatalf("%+v: question %q", opt, p.Question)
	}
	b := q[1]
	facts := reversalFact.FindAllStringSubmatchIndex(p.Context, -1)
	if len(facts) != reps+1 {
		t.Fatalf("%+v: %d facts, want %d", opt, len(facts), reps+1)
	}
	name := func(f []int) string { return p.Context[f[2]:f[3]] }
	code := func(f []int) string { return p.Context[f[4]:f[5]] }
	ib := 0 // B's fact: the first, or the second after A's
	if name(facts[0]) != b {
		ib = 1
		if facts[0][1] != facts[1][0] {
			t.Errorf("%+v: A's fact before B's is not right before it", opt)
		}
	}
	fb := facts[ib]
	if name(fb) != b || p.Answer != code(fb) {
		t.Fatalf("%+v: answer %q, B's fact %q", opt, p.Answer, p.Context[fb[0]:fb[1]])
	}
	fa := facts[1-ib]
	if p.Distractor != code(fa) {
		t.Errorf("%+v: distractor %q, A's code %q", opt, p.Distractor, code(fa))
	}
	for i, f := range facts {
		if i != ib && (name(f) != name(fa) || code(f) != code(fa) || name(f) == b || code(f) == p.Answer) {
			t.Errorf("%+v: fact %q is neither B's nor A's (B %s %s)", opt, p.Context[f[0]:f[1]], b, p.Answer)
		}
	}
	if strings.Count(text, p.Answer) != 1 {
		t.Errorf("%+v: B's code %s appears %d times", opt, p.Answer, strings.Count(text, p.Answer))
	}
	// Token positions as the harness builds them.
	ids := append([]int{tok.BOS()}, tok.Encode(p.Context)...)
	digit := -1
	for i := 1; i+5 <= len(ids); i++ {
		if tok.Decode(ids[i:i+5]) == p.Answer {
			digit = i
			break
		}
	}
	if digit != p.AnswerToken || digit != fb[4]+1 {
		t.Errorf("%+v: B's first digit is token %d, prompt says %d", opt, digit, p.AnswerToken)
	}
	if want >= 0 && digit%s != want {
		t.Errorf("%+v: B's first digit at in-page offset %d of %d, want %d", opt, digit%s, s, want)
	}
	label := opt.Offset
	if label == "" {
		label = "start"
	}
	if p.Offset != label {
		t.Errorf("%+v: offset label %q", opt, p.Offset)
	}
	// Removing the facts (and pads) leaves the intro and whole filler
	// blocks.
	rest := reversalFact.ReplaceAllString(p.Context, "")
	if opt.Align == AlignPad {
		rest = regexp.MustCompile(` {2,}`).ReplaceAllString(rest, " ")
	}
	body, ok := strings.CutPrefix(rest, PasskeyIntro)
	if !ok || strings.ReplaceAll(body, PasskeyFiller, "") != "" {
		t.Errorf("%+v: context is not intro, filler and facts: %q", opt, body)
	}
	// Every fact follows a filler-block boundary (possibly via other
	// facts), except B's with AlignSentence; pads only with AlignPad.
	blockStart := regexp.MustCompile(`(memorize it\. |back again\. ) *(` + reversalFact.String() + `)*$`)
	for i, f := range facts {
		pre := p.Context[:f[0]]
		if (i != ib || opt.Align != AlignSentence || opt.Offset == "any") && !blockStart.MatchString(pre) {
			t.Errorf("%+v: fact %d not at a filler-block boundary: ...%q", opt, i, pre[max(len(pre)-30, 0):])
		}
		if !strings.HasSuffix(pre, ". ") && opt.Align != AlignPad {
			t.Errorf("%+v: fact %d not at a sentence boundary: ...%q", opt, i, pre[max(len(pre)-30, 0):])
		}
	}
	// Depths: B's first, then A's in order, none before B's but the one
	// right before it; A's last right before the question.
	if len(p.Depths) != reps+1 || p.Depth() != p.Depths[0] {
		t.Fatalf("%+v: depths %v", opt, p.Depths)
	}
	for i := 1; i < len(p.Depths); i++ {
		if p.Depths[i] < p.Depths[max(i-1, 1)] || p.Depths[i] < p.Depths[0] || p.Depths[i] > 1 {
			t.Errorf("%+v: depths %v", opt, p.Depths)
		}
	}
	if ib == 1 && p.Depths[1] != p.Depths[0] {
		t.Errorf("%+v: A's fact right before B's at depth %v, B's %v", opt, p.Depths[1], p.Depths[0])
	}
	if last := facts[len(facts)-1]; last[1] != len(p.Context) || len(facts) > 1 && ib == len(facts)-1 {
		t.Errorf("%+v: the context does not end with A's fact", opt)
	}
}

// TestReversalDepth: B lands near the depth asked for, only A's first
// statement (if any) before it. With block alignment at S = 16 a block
// boundary reaches an offset once in 8 blocks (90 bytes is 10 mod 16),
// B alone for one parity and B after A's fact for the other: at most 4
// blocks away, 7 at the ends of the filler.
func TestReversalDepth(t *testing.T) {
	rng := rand.New(rand.NewPCG(4, 4))
	for _, align := range []string{AlignBlock, AlignSentence} {
		for _, d := range []float64{0, 0.1, 0.25, 0.5, 0.9} {
			for _, offset := range []string{"start", "middle", "end"} {
				p, err := Reversal(rng, 4096, ReversalOptions{Offset: offset, Depth: d, Align: align})
				if err != nil {
					t.Fatal(err)
				}
				blocks := float64(len(reversalFact.ReplaceAllString(p.Context, ""))-len(PasskeyIntro)) / float64(len(PasskeyFiller))
				tol := 4.0
				if d < 0.2 || d > 0.8 {
					tol = 7
				}
				if got := p.Depths[0]; math.Abs(got-d)*blocks > tol+1e-9 {
					t.Errorf("%s depth %v offset %s: B at %v", align, d, offset, got)
				}
				if p.AnswerToken%16 != map[string]int{"start": 0, "middle": 8, "end": 15}[offset] {
					t.Errorf("%s depth %v offset %s: token %d", align, d, offset, p.AnswerToken)
				}
				i := strings.Index(p.Context, p.Answer)
				if n := strings.Count(p.Context[:i], "The pass key of"); i < 0 || n > 2 || n == 2 && align != AlignBlock {
					t.Errorf("%s depth %v: %d facts up to B's", align, d, n)
				}
			}
		}
	}
	// Random depths stay early.
	for range 50 {
		p, err := Reversal(rng, 2048, ReversalOptions{Depth: -1})
		if err != nil {
			t.Fatal(err)
		}
		if p.Depths[0] > 0.6 {
			t.Errorf("random depth %v", p.Depths[0])
		}
	}
}

func TestReversalRefused(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 5))
	for _, bad := range []ReversalOptions{
		{PageSize: -1},
		{Offset: "top"},
		{Offset: "16"},
		{Offset: "-1"},
		{PageSize: 8, Offset: "8"},
		{Align: "stretch"},
		{Repeats: -2},
		{Depth: 1},
		{Depth: math.NaN()},
	} {
		if _, err := Reversal(rng, 2048, bad); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
	// Too short for a block boundary at the offset; a page size whose
	// offsets the two block alignments cannot all reach (gcd(90, 12) =
	// 6).
	if _, err := Reversal(rng, 600, ReversalOptions{PageSize: 64, Offset: "end"}); err == nil {
		t.Error("a 600-byte prompt placed the answer at the end of a 64-token page")
	}
	for o := range 12 {
		if _, err := Reversal(rng, 8192, ReversalOptions{PageSize: 12, Offset: fmt.Sprint(o)}); err != nil && !strings.Contains(err.Error(), "no block insertion point") {
			t.Errorf("page 12 offset %d: %v", o, err)
		}
	}
	if _, err := Reversal(rng, 8192, ReversalOptions{PageSize: 12, Offset: "1", Align: AlignPad}); err != nil {
		t.Errorf("padded to offset 1 of 12: %v", err)
	}
	for _, c := range []struct {
		name string
		s    int
		want int
	}{{"start", 16, 0}, {"", 16, 0}, {"middle", 16, 8}, {"middle", 7, 3}, {"end", 16, 15}, {"5", 16, 5}, {"any", 16, -1}} {
		if got, err := ResolveOffset(c.name, c.s); err != nil || got != c.want {
			t.Errorf("ResolveOffset(%q, %d) = %d, %v; want %d", c.name, c.s, got, err, c.want)
		}
	}
}

// TestAggregateByOffset: prompts of different offsets are separate rows,
// carrying task and offset; plain prompts keep both empty.
func TestAggregateByOffset(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Budgets = []int{64}
	agg := NewAggregate(cfg)
	for i, o := range []string{"start", "end", "start", ""} {
		p := Prompt{Length: 2048, Task: TaskReversal, Offset: o, Answer: "12345", Distractor: "67890"}
		if o == "" {
			p.Task, p.Distractor = "", ""
		}
		out := "67890" // A's code, or for the plain prompt any wrong answer
		if i == 0 {
			out = "12345"
		}
		agg.Add(&PromptResult{Prompt: p, Tokens: 2000,
			Dense: Run{Selector: plan.Dense, Output: "12345", Correct: true},
			Runs:  []Run{{Selector: cfg.Selectors[0], Budget: 64, Output: out, Correct: i == 0}}})
	}
	recs := agg.Records(2048)
	if len(recs) != 6 {
		t.Fatalf("%d records: %+v", len(recs), recs)
	}
	for i, want := range []struct {
		task, offset, sel      string
		n, correct, distractor int
	}{{TaskReversal, "start", "dense", 2, 2, 0}, {TaskReversal, "start", "quest", 2, 1, 1}, {TaskReversal, "end", "dense", 1, 1, 0}, {TaskReversal, "end", "quest", 1, 0, 1}, {"", "", "dense", 1, 1, 0}, {"", "", "quest", 1, 0, 0}} {
		r := recs[i]
		if r.Task != want.task || r.Offset != want.offset || r.Selector != want.sel || r.N != want.n || r.Correct != want.correct || r.DistractorAnswers != want.distractor {
			t.Errorf("record %d: %+v, want %+v", i, r, want)
		}
	}
	b, err := json.Marshal(recs[4])
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), `"task"`) || strings.Contains(string(b), `"offset"`) || strings.Contains(string(b), `"distractor_answers"`) {
		t.Errorf("plain record carries task or offset: %s", b)
	}
	if b, _ := json.Marshal(recs[0]); !strings.Contains(string(b), `"task":"reversal","offset":"start"`) {
		t.Errorf("reversal record: %s", b)
	}
}
