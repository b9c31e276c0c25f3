package eval

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"strings"
)

// The passkey prompt format the test models were trained on (bytes).
const (
	PasskeyIntro    = "There is important info hidden inside a lot of irrelevant text. Find it and memorize it. "
	PasskeyFiller   = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
	PasskeyQuestion = "What is the pass key? The pass key is "
)

// passkeyNames are the entities of multi-key prompts.
var passkeyNames = []string{"Alice", "Bob", "Carol", "David", "Emma", "Frank", "Grace", "Henry", "Irene", "James"}

// Prompt is one evaluation prompt: Context is prefilled, Question follows
// it (prefilled too, or fed through decode steps), and the model should
// continue with Answer.
type Prompt struct {
	Context  string
	Question string
	Answer   string
	// Length is the nominal length the prompt was made for (bytes), used
	// to group results.
	Length int
	// Depths of the facts in the context, 0 (start) .. 1 (end).
	Depths []float64
	// Task names the generator ("" for Passkey, "reversal" for
	// Reversal); results are grouped by it.
	Task string
	// Offset names where the answer's first digit was placed in its KV
	// page ("start", "middle", "end", a token offset, or "any"; "" when
	// not placed) and AnswerToken is that digit's token position (BOS
	// at 0; 0 when not recorded), so its in-page offset is AnswerToken
	// mod the page size.
	Offset      string
	AnswerToken int
	// Distractor is the code of a similar fact that is not the answer
	// (Reversal: A's), "" when none; results count the answers that
	// gave it.
	Distractor string
}

// Depth is the first fact's depth (NaN when unknown).
func (p Prompt) Depth() float64 {
	if len(p.Depths) == 0 {
		return math.NaN()
	}
	return p.Depths[0]
}

// Text is the whole prompt.
func (p Prompt) Text() string { return p.Context + p.Question }

// PasskeyOptions shape generated prompts.
type PasskeyOptions struct {
	// Keys is the number of facts (1: the single-key format; k > 1: one
	// "The pass key of NAME is ..." fact per name, a question about one).
	Keys int
	// Depths, when set, are the facts' depths in [0, 1] (one per key, or
	// one for all); otherwise each depth is uniform at random.
	Depths []float64
}

// Passkey builds a prompt of about length bytes: the intro, filler
// sentences with the fact(s) inserted at filler boundaries, and the
// question. The answer is 5 random digits (first digit not 0).
func Passkey(rng *rand.Rand, length int, opt PasskeyOptions) (Prompt, error) {
	keys := max(opt.Keys, 1)
	if keys > len(passkeyNames) {
		return Prompt{}, fmt.Errorf("passkey: %d keys (at most %d)", keys, len(passkeyNames))
	}
	if len(opt.Depths) > 1 && len(opt.Depths) != keys {
		return Prompt{}, fmt.Errorf("passkey: %d depths for %d keys", len(opt.Depths), keys)
	}
	for _, d := range opt.Depths {
		if !(d >= 0 && d <= 1) {
			return Prompt{}, fmt.Errorf("passkey: depth %v outside [0, 1]", d)
		}
	}
	facts := make([]string, keys)
	codes := make([]string, keys)
	for i := range keys {
		codes[i] = fmt.Sprint(10000 + rng.IntN(90000))
		if keys == 1 {
			facts[i] = fmt.Sprintf("The pass key is %s. Remember it. %s is the pass key. ", codes[i], codes[i])
		} else {
			facts[i] = namedFact(passkeyNames[i], codes[i])
		}
	}
	ask := rng.IntN(keys)
	question := PasskeyQuestion
	if keys > 1 {
		question = namedQuestion(passkeyNames[ask])
	}
	fixed := len(PasskeyIntro) + len(question)
	for _, f := range facts {
		fixed += len(f)
	}
	fillers := max((length-fixed+len(PasskeyFiller)/2)/len(PasskeyFiller), 0)
	depths := make([]float64, keys)
	at := make([]int, keys) // filler boundary of each fact
	for i := range keys {
		switch len(opt.Depths) {
		case 0:
			depths[i] = rng.Float64()
		case 1:
			depths[i] = opt.Depths[0]
		default:
			depths[i] = opt.Depths[i]
		}
		at[i] = int(depths[i]*float64(fillers) + 0.5)
	}
	var b strings.Builder
	b.WriteString(PasskeyIntro)
	for f := 0; f <= fillers; f++ {
		for i := range keys {
			if at[i] == f {
				b.WriteString(facts[i])
			}
		}
		if f < fillers {
			b.WriteString(PasskeyFiller)
		}
	}
	return Prompt{Context: b.String(), Question: question, Answer: codes[ask], Length: length, Depths: depths}, nil
}

// namedFact is one fact of the multi-key format; its code starts
// len(namedFactPrefix(name)) bytes in.
func namedFact(name, code string) string { return namedFactPrefix(name) + code + ". Remember it. " }

func namedFactPrefix(name string) string { return "The pass key of " + name + " is " }

// namedQuestion asks for one name's code in the multi-key format.
func namedQuestion(name string) string {
	return "What is the pass key of " + name + "? The pass key of " + name + " is "
}

// PromptLine is one line of a --prompts file.
type PromptLine struct {
	Prompt   string `json:"prompt"`
	Answer   string `json:"answer"`
	Length   int    `json:"length"`
	Question string `json:"question,omitempty"`
}

// ReadPrompts reads JSON lines {"prompt": ..., "answer": ..., "length":
// ...}. The question (fed through decode steps when asked) is the
// "question" field when given, else the prompt's last sentence after its
// last ". ", else empty; length defaults to the prompt's bytes.
func ReadPrompts(r io.Reader) ([]Prompt, error) {
	var ps []Prompt
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<30)
	line := 0
	for sc.Scan() {
		line++
		t := strings.TrimSpace(sc.Text())
		if t == "" {
			continue
		}
		var pl PromptLine
		if err := json.Unmarshal([]byte(t), &pl); err != nil {
			return nil, fmt.Errorf("prompts line %d: %w", line, err)
		}
		if pl.Prompt == "" || pl.Answer == "" {
			return nil, fmt.Errorf("prompts line %d: want non-empty prompt and answer", line)
		}
		if pl.Length < 0 {
			return nil, fmt.Errorf("prompts line %d: length %d", line, pl.Length)
		}
		p := Prompt{Context: pl.Prompt, Answer: pl.Answer, Length: pl.Length}
		q := pl.Question
		if q == "" {
			if i := strings.LastIndex(strings.TrimRight(pl.Prompt, " "), ". "); i >= 0 {
				q = pl.Prompt[i+2:]
			}
		}
		if q != "" {
			if !strings.HasSuffix(pl.Prompt, q) {
				return nil, fmt.Errorf("prompts line %d: question %q does not end the prompt", line, q)
			}
			p.Context, p.Question = pl.Prompt[:len(pl.Prompt)-len(q)], q
		}
		if p.Length == 0 {
			p.Length = len(pl.Prompt)
		}
		ps = append(ps, p)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(ps) == 0 {
		return nil, errors.New("prompts: no prompts")
	}
	return ps, nil
}
