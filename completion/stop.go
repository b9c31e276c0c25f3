package completion

import (
	"bytes"
	"unicode/utf8"
)

// stopText turns generated token text into the text a client may see:
// it matches stop strings on the decoded bytes (a stop string may span
// tokens) and holds back what could still become one, and the bytes of
// a character that is not complete yet. It is pure: no model, no I/O.
type stopText struct {
	stops [][]byte
	buf   []byte // every decoded byte so far
	sent  int    // bytes of buf released
}

func newStopText(stops []string) *stopText {
	t := &stopText{}
	for _, s := range stops {
		t.stops = append(t.stops, []byte(s))
	}
	return t
}

// add appends a token's text; it returns the bytes now safe to release
// and whether a stop string matched. The first stop string to complete,
// byte by byte, ends the text (of two completing at the same byte, the
// longer): the text released then ends where it starts, and nothing
// after it is ever released. So the result depends on the text alone,
// not on how tokens split it.
func (t *stopText) add(s string) (out []byte, stopped bool) {
	old := len(t.buf)
	t.buf = append(t.buf, s...)
	for e := old + 1; e <= len(t.buf) && len(t.stops) > 0; e++ {
		at := -1
		for _, st := range t.stops {
			// A match starts at or after sent: what could start one
			// earlier was held back.
			if b := e - len(st); b >= t.sent && (at < 0 || b < at) && bytes.Equal(t.buf[b:e], st) {
				at = b
			}
		}
		if at >= 0 {
			out = t.buf[t.sent:at:at]
			t.sent = len(t.buf)
			return out, true
		}
	}
	rest := t.buf[t.sent:]
	hold := 0
	for _, st := range t.stops {
		for l := min(len(st)-1, len(rest)); l > hold; l-- {
			if bytes.HasSuffix(rest, st[:l]) {
				hold = l
				break
			}
		}
	}
	hold = max(hold, partialRune(rest))
	out = rest[: len(rest)-hold : len(rest)-hold]
	t.sent += len(out)
	return out, false
}

// flush releases what was held back (the completion ended without a
// stop string).
func (t *stopText) flush() []byte {
	out := t.buf[t.sent:]
	t.sent = len(t.buf)
	return out
}

// partialRune is the length of an incomplete UTF-8 encoding at the end
// of b (0 when b ends on a whole character or on bytes that can never
// become one).
func partialRune(b []byte) int {
	for n := 1; n <= min(utf8.UTFMax-1, len(b)); n++ {
		c := b[len(b)-n]
		if c < 0x80 {
			return 0 // ASCII: nothing open after it
		}
		if utf8.RuneStart(c) {
			if utf8.FullRune(b[len(b)-n:]) {
				return 0
			}
			return n
		}
	}
	return 0
}
