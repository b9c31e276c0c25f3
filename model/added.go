package model

import (
	"sort"
	"strings"
	"unicode"
	"unicode/utf8"
)

// This file matches the added tokens of a tokenizer (<|begin_of_text|>
// and the like) in raw text, with their lstrip, rstrip and single_word
// flags.

// addedMatcher finds added tokens in text: leftmost, then longest, with
// a byte trie.
type addedMatcher struct {
	nodes []addedNode
	first [256]bool
	toks  []addedTokenJSON // by trie terminal index
}

type addedNode struct {
	next map[byte]int32
	tok  int32 // index into toks, -1: none
}

func newAddedMatcher(toks []addedTokenJSON) *addedMatcher {
	m := &addedMatcher{nodes: []addedNode{{tok: -1}}}
	// Sorted for determinism; a repeated content keeps its first id.
	sort.SliceStable(toks, func(i, j int) bool { return toks[i].Content < toks[j].Content })
	for _, a := range toks {
		n := int32(0)
		for i := 0; i < len(a.Content); i++ {
			c := a.Content[i]
			if i == 0 {
				m.first[c] = true
			}
			nx, ok := m.nodes[n].next[c]
			if !ok {
				if m.nodes[n].next == nil {
					m.nodes[n].next = make(map[byte]int32)
				}
				nx = int32(len(m.nodes))
				m.nodes[n].next[c] = nx
				m.nodes = append(m.nodes, addedNode{tok: -1})
			}
			n = nx
		}
		if m.nodes[n].tok < 0 {
			m.nodes[n].tok = int32(len(m.toks))
			m.toks = append(m.toks, a)
		}
	}
	return m
}

// exact returns the id of the token whose content is s.
func (m *addedMatcher) exact(s string) (int, bool) {
	n := int32(0)
	for i := 0; i < len(s); i++ {
		nx, ok := m.nodes[n].next[s[i]]
		if !ok {
			return -1, false
		}
		n = nx
	}
	if k := m.nodes[n].tok; k >= 0 {
		return m.toks[k].ID, true
	}
	return -1, false
}

// find calls yield with the byte range and id of each match in s, in
// order and without overlaps, the ranges widened by lstrip and rstrip.
func (m *addedMatcher) find(s string, yield func(a, b, id int)) {
	prevEnd := 0
	for i := 0; i < len(s); {
		if !m.first[s[i]] {
			i++
			continue
		}
		n, best, end := int32(0), int32(-1), 0
		for j := i; j < len(s); j++ {
			nx, ok := m.nodes[n].next[s[j]]
			if !ok {
				break
			}
			n = nx
			if k := m.nodes[n].tok; k >= 0 {
				best, end = k, j+1
			}
		}
		if best < 0 {
			i++
			continue
		}
		a, b, tok := i, end, m.toks[best]
		if tok.SingleWord && (endsWithWord(s[:a]) || startsWithWord(s[b:])) {
			i = b // the Rust crate does not look inside a rejected match
			continue
		}
		if tok.LStrip {
			a = max(a-trailingSpace(s[prevEnd:a]), prevEnd)
		}
		if tok.RStrip {
			b += leadingSpace(s[b:])
		}
		yield(a, b, tok.ID)
		prevEnd, i = b, b
	}
}

func isWordRune(r rune) bool { return unicode.IsLetter(r) || unicode.IsDigit(r) || r == '_' }

func endsWithWord(s string) bool {
	r, n := utf8.DecodeLastRuneInString(s)
	return n > 0 && isWordRune(r)
}

func startsWithWord(s string) bool {
	r, n := utf8.DecodeRuneInString(s)
	return n > 0 && isWordRune(r)
}

func trailingSpace(s string) int {
	return len(s) - len(strings.TrimRightFunc(s, unicode.IsSpace))
}

func leadingSpace(s string) int {
	return len(s) - len(strings.TrimLeftFunc(s, unicode.IsSpace))
}
