package replay

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"

	"github.com/questrt/questrt/internal/memlimit"
)

// MaxCaseBytes caps the case file [DecodeLimit] reads, whatever the memory
// limit (with memlimit.NoLimit too).
const MaxCaseBytes = 1 << 30

// InputShare is the part of the memory limit a case file may take:
// [DecodeLimit] reads at most memoryLimit / InputShare bytes. Decoding
// keeps the input and allocates the tensors exactly (4 bytes a value, a
// 24-byte slice header a row and a head, no growth): at most 9 bytes of
// memory a byte of JSON (empty rows "[]," and heads), 8 for rows of one
// number "[1],", so a case that passes takes under a third of the limit.
const InputShare = 32

// InputLimit returns the most bytes [DecodeLimit] reads under memoryLimit
// (a byte count, memlimit.Auto or memlimit.NoLimit): 1/[InputShare] of the
// limit, of the memory available now when that is lower (as
// [memlimit.Check] caps a limit) or with memlimit.Auto, and at most
// [MaxCaseBytes] (the cap alone with memlimit.NoLimit, or where the
// available memory cannot be read). why explains the bound for an error
// message.
func InputLimit(memoryLimit int64) (n int64, why string, err error) {
	return inputLimit(memoryLimit, memlimit.Available)
}

// inputLimit is [InputLimit] with the available memory read through
// available (memlimit.Available in use; a fixed figure in tests, since the
// machine's changes between two readings).
func inputLimit(memoryLimit int64, available func() (int64, error)) (n int64, why string, err error) {
	if memoryLimit < memlimit.NoLimit {
		return 0, "", fmt.Errorf("replay case: memory limit %d: want bytes, 0 (available memory) or -1 (no check)", memoryLimit)
	}
	capped := fmt.Sprintf("the %s cap on case files, whatever --max-memory", memlimit.Bytes(MaxCaseBytes))
	if memoryLimit == memlimit.NoLimit {
		return MaxCaseBytes, capped, nil
	}
	share := func(of, hint string) string {
		return fmt.Sprintf("1/%d of %s: decoding takes up to 10 bytes of memory a byte of JSON, and the run needs the rest; %s", InputShare, of, hint)
	}
	base := memoryLimit
	why = share(fmt.Sprintf("the %s memory limit", memlimit.Bytes(memoryLimit)), "set a larger --max-memory")
	if avail, err := available(); err == nil && (base == memlimit.Auto || avail < base) {
		base = avail
		hint := "free memory"
		if memoryLimit == memlimit.Auto {
			hint = "free memory or set --max-memory"
		}
		why = share(fmt.Sprintf("the %s of memory available now", memlimit.Bytes(avail)), hint)
	}
	if base == memlimit.Auto || base/InputShare >= MaxCaseBytes {
		return MaxCaseBytes, capped, nil
	}
	return base / InputShare, why, nil
}

// Decode reads a case as [DecodeLimit] does under memlimit.Auto (the
// memory available now).
func Decode(r io.Reader) (*Case, error) { return DecodeLimit(r, memlimit.Auto) }

// DecodeLimit reads a case from JSON and validates it. It reads at most
// [InputLimit](memoryLimit) bytes and refuses a larger input before
// decoding further. The JSON is checked strictly, beyond encoding/json: one
// object with only the case's fields, spelled exactly (names are
// case-sensitive) and each at most once; no null anywhere; integers for
// the sizes, a string for gqa, numbers inside float32's range for the
// tensors; nothing but white space after the object. A first pass checks
// all of that and counts the tensors' heads, rows and values, keeping the
// input; a second pass over the kept input fills arrays of exactly those
// sizes (every row a slice of one flat array per tensor). Every error is
// one line starting "replay case".
func DecodeLimit(r io.Reader, memoryLimit int64) (c *Case, err error) {
	limit, why, err := InputLimit(memoryLimit)
	if err != nil {
		return nil, err
	}
	defer func() {
		if e := recover(); e != nil {
			de, ok := e.(decodeError)
			if !ok {
				panic(e)
			}
			c, err = nil, de.err
		}
	}()
	rec := &recorder{r: io.LimitReader(r, limit+1)}
	check := &decoder{r: rec, limit: limit, why: why, buf: make([]byte, 16<<10)}
	check.decodeCase()
	fill := &decoder{r: rec.replay(), limit: limit, why: why, buf: check.buf, fill: true}
	for i, t := range check.tensors {
		fill.tensors[i].alloc(t)
	}
	c = fill.decodeCase()
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return c, nil
}

// recorder keeps what it reads, in chunks that double up to 1 MiB, for
// the second pass.
type recorder struct {
	r      io.Reader
	chunks [][]byte
}

func (rc *recorder) Read(p []byte) (int, error) {
	n, err := rc.r.Read(p)
	for b := p[:n]; len(b) > 0; {
		last := len(rc.chunks) - 1
		if last < 0 || len(rc.chunks[last]) == cap(rc.chunks[last]) {
			size := 4 << 10
			if last >= 0 {
				size = min(2*cap(rc.chunks[last]), 1<<20)
			}
			rc.chunks = append(rc.chunks, make([]byte, 0, size))
			last++
		}
		k := min(len(b), cap(rc.chunks[last])-len(rc.chunks[last]))
		rc.chunks[last] = append(rc.chunks[last], b[:k]...)
		b = b[k:]
	}
	return n, err
}

// replay reads back what rc read.
func (rc *recorder) replay() io.Reader {
	rs := make([]io.Reader, len(rc.chunks))
	for i, c := range rc.chunks {
		rs[i] = bytes.NewReader(c)
	}
	return io.MultiReader(rs...)
}

// decodeError carries a decoding error through panics inside the decoder.
type decodeError struct{ err error }

// decoder reads one case from a bounded stream, a buffer at a time.
type decoder struct {
	r     io.Reader
	buf   []byte
	pos   int   // next unread byte of buf
	end   int   // bytes of buf read so far
	off   int64 // input offset of buf[0]
	limit int64 // most input bytes
	why   string
	eof   bool
	// fill is the second pass: tensors holds the first pass's counts and
	// arrays of those sizes, which the values fill.
	fill    bool
	tensors [3]tensor // keys, values, query
}

func (d *decoder) fail(format string, args ...any) {
	panic(decodeError{fmt.Errorf("replay case: "+format, args...)})
}

// more reads more input into buf, keeping buf[d.pos:d.end] (moved to the
// front). It returns false at the end of the input.
func (d *decoder) more() bool {
	if d.eof {
		return false
	}
	if d.pos > 0 {
		n := copy(d.buf, d.buf[d.pos:d.end])
		d.off += int64(d.pos)
		d.end, d.pos = n, 0
	}
	if d.end == len(d.buf) {
		// One token fills the buffer (a long number or string).
		d.buf = append(d.buf, make([]byte, len(d.buf))...)
	}
	for {
		n, err := d.r.Read(d.buf[d.end:])
		d.end += n
		if d.off+int64(d.end) > d.limit {
			d.fail("case file is larger than %d bytes (%s): %w", d.limit, d.why, memlimit.ErrTooLarge)
		}
		if err == io.EOF {
			d.eof = true
			return n > 0
		}
		if err != nil {
			d.fail("reading the case: %v", err)
		}
		if n > 0 {
			return true
		}
	}
}

// at is the input offset of the next unread byte, for messages.
func (d *decoder) at() int64 { return d.off + int64(d.pos) }

// peek skips white space and returns the next byte, or fails at the end
// of the input naming what was expected.
func (d *decoder) peek(want string) byte {
	for {
		for d.pos < d.end {
			switch b := d.buf[d.pos]; b {
			case ' ', '\t', '\n', '\r':
				d.pos++
			default:
				return b
			}
		}
		if !d.more() {
			d.fail("unexpected end of input at byte %d (want %s)", d.at(), want)
		}
	}
}

// atEnd skips white space and reports whether the input ends there.
func (d *decoder) atEnd() bool {
	for {
		for d.pos < d.end {
			switch d.buf[d.pos] {
			case ' ', '\t', '\n', '\r':
				d.pos++
			default:
				return false
			}
		}
		if !d.more() {
			return true
		}
	}
}

// found describes the value starting with b, for messages.
func found(b byte) string {
	switch {
	case b == '{':
		return "an object"
	case b == '[':
		return "an array"
	case b == '"':
		return "a string"
	case b == 't' || b == 'f':
		return "a boolean"
	case b == 'n':
		return "null"
	case b == '-' || b >= '0' && b <= '9':
		return "a number"
	case b >= 0x20 && b < 0x7f:
		return fmt.Sprintf("%q", rune(b))
	}
	return fmt.Sprintf("byte %#02x", b)
}

// expect consumes byte want at the next non-space position or fails: a
// null names the field as null, anything else says what was found.
func (d *decoder) expect(want byte, field, what string) {
	b := d.peek(what)
	if b == want {
		d.pos++
		return
	}
	d.wrong(b, field, what)
}

// wrong fails for value byte b where field wants what.
func (d *decoder) wrong(b byte, field, what string) {
	if b == 'n' {
		d.fail("%s is null at byte %d (want %s; null is not allowed)", field, d.at(), what)
	}
	d.fail("%s: want %s, found %s at byte %d", field, what, found(b), d.at())
}

// fieldNames are the case's fields, in the order Encode writes them.
var fieldNames = [...]string{"page_size", "budget_tokens", "gqa", "sink_pages", "local_pages", "q_heads", "kv_heads", "head_dim", "keys", "values", "query"}

// decodeCase reads the case object and checks that only white space
// follows it.
func (d *decoder) decodeCase() *Case {
	c := &Case{}
	d.expect('{', "the case", "a JSON object")
	var seen [len(fieldNames)]bool
	if d.peek(`a field name or "}"`) == '}' {
		d.pos++
	} else {
		for {
			if b := d.peek("a field name"); b != '"' {
				d.fail("want a field name (a string), found %s at byte %d", found(b), d.at())
			}
			at := d.at()
			name := d.str("a field name")
			i := fieldIndex(name)
			if i < 0 {
				for _, f := range fieldNames {
					if strings.EqualFold(f, name) {
						d.fail("unknown field %q at byte %d (field names are case-sensitive: want %q)", name, at, f)
					}
				}
				if len(name) > 40 {
					d.fail("unknown field %q... (%d bytes) at byte %d", name[:32], len(name), at)
				}
				d.fail("unknown field %q at byte %d", name, at)
			}
			if seen[i] {
				d.fail("duplicate field %q at byte %d (each field may appear once)", name, at)
			}
			seen[i] = true
			d.expect(':', name, `":" after the field name`)
			switch name {
			case "page_size":
				c.PageSize = d.int(name)
			case "budget_tokens":
				c.BudgetTokens = d.int(name)
			case "gqa":
				if b := d.peek("a string"); b != '"' {
					d.wrong(b, name, "a string")
				}
				at := d.at()
				if c.GQA = d.str(name); len(c.GQA) > 32 {
					d.fail("gqa: a string of %d bytes at byte %d (want group_max or per_head)", len(c.GQA), at)
				}
			case "sink_pages":
				c.SinkPages = d.int(name)
			case "local_pages":
				c.LocalPages = d.int(name)
			case "q_heads":
				c.QHeads = d.int(name)
			case "kv_heads":
				c.KVHeads = d.int(name)
			case "head_dim":
				c.HeadDim = d.int(name)
			case "keys":
				c.Keys = d.tensor3(name)
			case "values":
				c.Values = d.tensor3(name)
			case "query":
				c.Query = d.tensor2(name)
			}
			b := d.peek(`"," or "}"`)
			d.pos++
			if b == '}' {
				break
			}
			if b != ',' {
				d.pos--
				d.fail(`want "," or "}" after field %q, found %s at byte %d`, name, found(b), d.at())
			}
		}
	}
	if !d.atEnd() {
		d.fail("trailing data after the JSON object at byte %d", d.at())
	}
	return c
}

func fieldIndex(name string) int {
	for i, f := range fieldNames {
		if f == name {
			return i
		}
	}
	return -1
}

// str reads the JSON string at d.pos (its opening quote) and returns its
// value.
func (d *decoder) str(field string) string {
	// Find the closing quote; indices are relative to d.pos, which more
	// keeps in place.
	i, escaped := 1, false
	for {
		for ; d.pos+i < d.end; i++ {
			switch b := d.buf[d.pos+i]; {
			case b == '\\':
				escaped = true
				i++ // the escaped byte (checked by json.Unmarshal)
			case b == '"':
				raw := d.buf[d.pos : d.pos+i+1]
				if !escaped {
					d.pos += i + 1
					return string(raw[1 : len(raw)-1])
				}
				var s string
				if err := json.Unmarshal(raw, &s); err != nil {
					d.fail("%s: bad string at byte %d: %v", field, d.at(), err)
				}
				d.pos += i + 1
				return s
			case b < 0x20:
				d.fail("%s: control character %#02x in a string at byte %d", field, b, d.at()+int64(i))
			}
		}
		if !d.more() {
			d.fail("%s: unterminated string at byte %d", field, d.at())
		}
	}
}

// path names a value of the case in messages: a field and up to three
// indices ("keys[0][3][1]"). It is formatted only on errors.
type path struct {
	name string
	n    int
	idx  [3]int
}

func (p path) at(i int) path {
	p.idx[p.n] = i
	p.n++
	return p
}

// elem is p's element j, or p when j < 0.
func (p path) elem(j int) path {
	if j < 0 {
		return p
	}
	return p.at(j)
}

func (p path) String() string {
	var b strings.Builder
	b.WriteString(p.name)
	for _, i := range p.idx[:p.n] {
		fmt.Fprintf(&b, "[%d]", i)
	}
	return b.String()
}

// number returns the text of the JSON number at the next non-space
// position and moves past it. The text is valid until the next read. The
// value is p, or p's element j when j >= 0 (built on errors only).
func (d *decoder) number(p path, j int, what string) []byte {
	b := d.peek(what)
	if b != '-' && (b < '0' || b > '9') {
		d.wrong(b, p.elem(j).String(), what)
	}
	for {
		switch n := numLen(d.buf[d.pos:d.end], d.eof); {
		case n > 0:
			t := d.buf[d.pos : d.pos+n]
			d.pos += n
			return t
		case n == 0:
			end := d.pos
			for end < d.end && end-d.pos < 32 && !isDelim(d.buf[end]) {
				end++
			}
			d.fail("%s: malformed number %q at byte %d", p.elem(j), d.buf[d.pos:end], d.at())
		}
		d.more() // n < 0: the number may go on; at the end of the input, eof is set
	}
}

func isDelim(b byte) bool {
	switch b {
	case ',', ']', '}', ' ', '\t', '\n', '\r':
		return true
	}
	return false
}

// numLen returns the length of the JSON number
// (-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?) that b starts with,
// when a delimiter (or, at eof, the end of b) ends it; 0 when b does not
// start with one or one ends in a byte that cannot follow a number; -1
// when b ends before the number could end and more input may follow.
func numLen(b []byte, eof bool) int {
	i := 0
	digits := func() int { // digits from i; the count read
		n := 0
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
			n++
		}
		return n
	}
	// end decides at position i, where the grammar may stop (ok) or not.
	end := func(ok bool) int {
		if i == len(b) {
			if !eof {
				return -1
			}
			if ok {
				return i
			}
			return 0
		}
		if ok && isDelim(b[i]) {
			return i
		}
		return 0
	}
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i == len(b):
		return end(false)
	case b[i] == '0':
		i++
	case b[i] >= '1' && b[i] <= '9':
		digits()
	default:
		return 0
	}
	if i == len(b) {
		return end(true)
	}
	if b[i] == '.' {
		i++
		if digits() == 0 {
			return end(false)
		}
		if i == len(b) {
			return end(true)
		}
	}
	if b[i] == 'e' || b[i] == 'E' {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if digits() == 0 {
			return end(false)
		}
	}
	return end(true)
}

// int reads an integer field: a JSON number without fraction or exponent
// that fits an int.
func (d *decoder) int(field string) int {
	t := d.number(path{name: field}, -1, "an integer")
	at := d.at() - int64(len(t))
	v, err := strconv.ParseInt(string(t), 10, 64)
	if err != nil {
		if errors.Is(err, strconv.ErrRange) {
			d.fail("%s %s at byte %d overflows a 64-bit integer", field, clip(t), at)
		}
		d.fail("%s %s at byte %d is not an integer", field, clip(t), at)
	}
	if v < math.MinInt || v > math.MaxInt {
		d.fail("%s %s at byte %d overflows int", field, clip(t), at)
	}
	return int(v)
}

// float reads one tensor value, p's element j. The first pass checks its syntax, and
// its range only where it could be out of float32's (an exponent, or 39
// integer digits or more); the second parses it.
func (d *decoder) float(p path, j int) float32 {
	t := d.number(p, j, "a number")
	if !d.fill && !maybeHuge(t) {
		return 0
	}
	v, err := strconv.ParseFloat(string(t), 32)
	if err != nil {
		d.fail("%s: %s at byte %d is beyond the float32 range", p.elem(j), clip(t), d.at()-int64(len(t)))
	}
	return float32(v)
}

// maybeHuge reports whether the JSON number t could be beyond float32's
// range (about 3.4e38): it has an exponent or 39 integer digits or more.
func maybeHuge(t []byte) bool {
	digits := 0
	for _, b := range t {
		switch {
		case b == 'e' || b == 'E':
			return true
		case b == '.':
			return digits >= 39
		case b >= '0' && b <= '9':
			digits++
		}
	}
	return digits >= 39
}

// clip shortens t for a message.
func clip(t []byte) string {
	if len(t) > 40 {
		return fmt.Sprintf("%s... (%d bytes)", t[:32], len(t))
	}
	return string(t)
}

// tensor is one tensor field. The first pass counts its heads, rows and
// values; the second fills arrays of exactly those sizes, every row a
// slice of flat and every head a slice of rows.
type tensor struct {
	heads, rows, values int
	flat                []float32
	rowArr              [][]float32
	headArr             [][][]float32
}

// alloc makes tn's arrays for the counts of the first pass.
func (tn *tensor) alloc(counts tensor) {
	tn.flat = make([]float32, 0, counts.values)
	tn.rowArr = make([][]float32, 0, counts.rows)
	tn.headArr = make([][][]float32, 0, counts.heads)
}

// rows reads one array of rows of numbers, p, into tn.
func (d *decoder) rows(tn *tensor, p path, what string) {
	if b := d.peek(what); b != '[' {
		d.wrong(b, p.String(), what)
	}
	d.pos++
	if d.peek(`a row or "]"`) == ']' {
		d.pos++
		return
	}
	for t := 0; ; t++ {
		row := p.at(t)
		if b := d.peek("a row of numbers"); b != '[' {
			d.wrong(b, row.String(), "a row of numbers")
		}
		d.pos++
		start := len(tn.flat)
		if d.peek(`a number or "]"`) == ']' {
			d.pos++
		} else {
			for j := 0; ; j++ {
				x := d.float(row, j)
				if d.fill {
					tn.flat = append(tn.flat, x) // within the counted capacity
				} else {
					tn.values++
				}
				b := d.peek(`"," or "]"`)
				d.pos++
				if b == ']' {
					break
				}
				if b != ',' {
					d.pos--
					d.fail(`%s: want "," or "]" after a number, found %s at byte %d`, row, found(b), d.at())
				}
			}
		}
		if d.fill {
			tn.rowArr = append(tn.rowArr, tn.flat[start:len(tn.flat):len(tn.flat)])
		} else {
			tn.rows++
		}
		b := d.peek(`"," or "]"`)
		d.pos++
		if b == ']' {
			return
		}
		if b != ',' {
			d.pos--
			d.fail(`%s: want "," or "]" after a row, found %s at byte %d`, p, found(b), d.at())
		}
	}
}

// tensorIndex is the index of a tensor field in decoder.tensors.
func tensorIndex(name string) int {
	switch name {
	case "keys":
		return 0
	case "values":
		return 1
	}
	return 2
}

// tensor3 reads a [heads][tokens][dim] array; nil in the first pass.
func (d *decoder) tensor3(name string) [][][]float32 {
	tn := &d.tensors[tensorIndex(name)]
	const what = "an array of kv heads"
	if b := d.peek(what); b != '[' {
		d.wrong(b, name, what)
	}
	d.pos++
	if d.peek(`a head or "]"`) == ']' {
		d.pos++
	} else {
		for h := 0; ; h++ {
			start := len(tn.rowArr)
			d.rows(tn, path{name: name}.at(h), "an array of token rows")
			if d.fill {
				tn.headArr = append(tn.headArr, tn.rowArr[start:len(tn.rowArr):len(tn.rowArr)])
			} else {
				tn.heads++
			}
			b := d.peek(`"," or "]"`)
			d.pos++
			if b == ']' {
				break
			}
			if b != ',' {
				d.pos--
				d.fail(`%s: want "," or "]" after a head, found %s at byte %d`, name, found(b), d.at())
			}
		}
	}
	if !d.fill {
		return nil
	}
	return tn.headArr
}

// tensor2 reads a [heads][dim] array; nil in the first pass.
func (d *decoder) tensor2(name string) [][]float32 {
	tn := &d.tensors[tensorIndex(name)]
	d.rows(tn, path{name: name}, "an array of query rows")
	if !d.fill {
		return nil
	}
	return tn.rowArr
}
