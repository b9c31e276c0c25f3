package model

import (
	"encoding/json"
	"fmt"
	"unicode/utf8"

	"github.com/dlclark/regexp2/v2"
)

// This file is the byte-level path's pre-tokenizer: the Split patterns
// and ByteLevel of tokenizer.json, and the split of a text by them.

// gpt2Pattern is the split pattern of ByteLevel with use_regex true (the
// Rust crate's built-in, not in the file).
const gpt2Pattern = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`

// preTokJSON is one pre-tokenizer component.
type preTokJSON struct {
	Type          string            `json:"type"`
	PreTokenizers []json.RawMessage `json:"pretokenizers"`
	Pattern       struct {
		Regex  *string `json:"Regex"`
		String *string `json:"String"`
	} `json:"pattern"`
	Behavior       string `json:"behavior"`
	Invert         bool   `json:"invert"`
	AddPrefixSpace bool   `json:"add_prefix_space"`
	UseRegex       *bool  `json:"use_regex"`
}

// parsePreTokenizer returns the split patterns, in order.
func parsePreTokenizer(raw json.RawMessage) ([]*regexp2.Regexp, error) {
	if isNull(raw) {
		return nil, fmt.Errorf("%w: pre_tokenizer null (want ByteLevel, or a Sequence of Splits and ByteLevel)", ErrUnsupported)
	}
	var top preTokJSON
	if err := json.Unmarshal(raw, &top); err != nil {
		return nil, fmt.Errorf("%w: pre_tokenizer: %v", ErrTokenizer, err)
	}
	parts := []json.RawMessage{raw}
	if top.Type == "Sequence" {
		parts = top.PreTokenizers
	}
	var res []*regexp2.Regexp
	for i, p := range parts {
		var c preTokJSON
		if err := json.Unmarshal(p, &c); err != nil {
			return nil, fmt.Errorf("%w: pre_tokenizer %d: %v", ErrTokenizer, i, err)
		}
		last := i == len(parts)-1
		switch c.Type {
		case "Split":
			if last {
				return nil, fmt.Errorf("%w: pre_tokenizer %d: Split after ByteLevel (want ByteLevel last)", ErrUnsupported, i)
			}
			if c.Behavior != "Isolated" {
				return nil, fmt.Errorf("%w: pre_tokenizer %d: Split behavior %q (only Isolated)", ErrUnsupported, i, c.Behavior)
			}
			if c.Invert {
				return nil, fmt.Errorf("%w: pre_tokenizer %d: Split invert true", ErrUnsupported, i)
			}
			var pat string
			switch {
			case c.Pattern.Regex != nil:
				pat = *c.Pattern.Regex
			case c.Pattern.String != nil:
				if *c.Pattern.String == "" {
					return nil, fmt.Errorf("%w: pre_tokenizer %d: empty String pattern", ErrUnsupported, i)
				}
				pat = regexp2.Escape(*c.Pattern.String)
			default:
				return nil, fmt.Errorf("%w: pre_tokenizer %d: Split without a Regex or String pattern", ErrTokenizer, i)
			}
			re, err := compileSplit(pat)
			if err != nil {
				return nil, fmt.Errorf("%w: pre_tokenizer %d: pattern %q: %v", ErrUnsupported, i, pat, err)
			}
			res = append(res, re)
		case "ByteLevel":
			if !last {
				return nil, fmt.Errorf("%w: pre_tokenizer %d: ByteLevel before %s (want ByteLevel last)", ErrUnsupported, i, typeOf(parts[i+1]))
			}
			if c.AddPrefixSpace {
				return nil, fmt.Errorf("%w: pre_tokenizer %d: ByteLevel add_prefix_space true", ErrUnsupported, i)
			}
			if c.UseRegex == nil || *c.UseRegex {
				res = append(res, regexp2.MustCompile(gpt2Pattern, regexp2.OptionMaxBacktrackingStackSize(-1)))
			}
			return res, nil
		default:
			return nil, fmt.Errorf("%w: pre_tokenizer %d: %s (want Split or ByteLevel)", ErrUnsupported, i, typeOf(p))
		}
	}
	return nil, fmt.Errorf("%w: pre_tokenizer has no ByteLevel (not a byte-level BPE)", ErrUnsupported)
}

// compileSplit compiles a split pattern. The backtracking stack is left
// unbounded: Llama-3's \s*[\r\n]+ backtracks over a whole whitespace run,
// so the stack grows with the input's longest run, not beyond.
func compileSplit(pat string) (*regexp2.Regexp, error) {
	return regexp2.Compile(pat, regexp2.OptionMaxBacktrackingStackSize(-1))
}

// preTokenize calls emit with each pre-token of s, in order.
func (t *BPETokenizer) preTokenize(s string, emit func(string)) {
	if s == "" {
		return
	}
	if len(t.split) == 0 {
		emit(s)
		return
	}
	// Runes of s (invalid bytes as U+FFFD, one each) and the byte offset
	// of each rune, plus len(s).
	n := utf8.RuneCountInString(s)
	runes := make([]rune, 0, n)
	offs := make([]int, 0, n+1)
	for i, r := range s {
		runes = append(runes, r)
		offs = append(offs, i)
	}
	offs = append(offs, len(s))
	t.splitAt(s, runes, offs, 0, 0, len(runes), emit)
}

// splitAt applies split pattern k to the runes [lo, hi) (Isolated: the
// matches and the gaps between them are pieces) and passes each piece on.
func (t *BPETokenizer) splitAt(s string, runes []rune, offs []int, k, lo, hi int, emit func(string)) {
	if k == len(t.split) {
		emit(s[offs[lo]:offs[hi]])
		return
	}
	in := runes[lo:hi]
	pos := 0
	err := t.split[k].FindRunesMatches(in, 0, func(v regexp2.MatchView) bool {
		i, l, ok := v.GroupRange(0)
		if !ok || l == 0 {
			return true
		}
		if i > pos {
			t.splitAt(s, runes, offs, k+1, lo+pos, lo+i, emit)
		}
		t.splitAt(s, runes, offs, k+1, lo+i, lo+i+l, emit)
		pos = i + l
		return true
	})
	// An error is not expected (no timeout, unbounded stack); on one the
	// rest is one piece, so the text still round-trips.
	_ = err
	if pos < len(in) {
		t.splitAt(s, runes, offs, k+1, lo+pos, hi, emit)
	}
}
