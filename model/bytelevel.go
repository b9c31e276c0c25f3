package model

import "strings"

// This file is GPT-2's byte-level alphabet: the mapping of bytes to the
// printable characters a byte-level tokenizer.json is written in.

// byteToRune and runeToByte are GPT-2's bytes_to_unicode and its inverse.
var byteToRune, runeToByte = func() ([256]rune, map[rune]byte) {
	var b2r [256]rune
	r2b := make(map[rune]byte, 256)
	n := 0
	for b := range 256 {
		if (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF) {
			b2r[b] = rune(b)
		} else {
			b2r[b] = rune(256 + n)
			n++
		}
		r2b[b2r[b]] = byte(b)
	}
	return b2r, r2b
}()

// ByteLevelEncode maps bytes to GPT-2's byte-level characters (what the
// vocabulary of a byte-level tokenizer.json is written in).
func ByteLevelEncode(b []byte) string {
	var s strings.Builder
	s.Grow(2 * len(b))
	for _, c := range b {
		s.WriteRune(byteToRune[c])
	}
	return s.String()
}

// ByteLevelDecode maps byte-level characters back to bytes; ok is false
// when s holds a character outside the mapping.
func ByteLevelDecode(s string) (b []byte, ok bool) {
	b = make([]byte, 0, len(s))
	for _, r := range s {
		c, in := runeToByte[r]
		if !in {
			return nil, false
		}
		b = append(b, c)
	}
	return b, true
}
