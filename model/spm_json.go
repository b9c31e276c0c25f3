package model

import (
	"encoding/json"
	"fmt"
	"unicode/utf8"
)

// This file reads the SentencePiece-style path's normalizer,
// pre-tokenizer and decoder from a tokenizer.json (see spm.go for what
// of them is supported).

// spmPart is one normalizer, pre-tokenizer or decoder component.
type spmPart struct {
	Type        string            `json:"type"`
	Normalizers []json.RawMessage `json:"normalizers"`
	PreToks     []json.RawMessage `json:"pretokenizers"`
	Decoders    []json.RawMessage `json:"decoders"`
	Prepend     *string           `json:"prepend"`
	Pattern     struct {
		String *string `json:"String"`
		Regex  *string `json:"Regex"`
	} `json:"pattern"`
	Content        *json.RawMessage `json:"content"`
	Replacement    *string          `json:"replacement"`
	PrependScheme  *string          `json:"prepend_scheme"`
	AddPrefixSpace *bool            `json:"add_prefix_space"`
	Split          *bool            `json:"split"`
	Start          int              `json:"start"`
	Stop           int              `json:"stop"`
}

// isByteLevelDecoder tells whether raw is the byte-level path's decoder
// (also null or unreadable, which that path reports).
func isByteLevelDecoder(raw json.RawMessage) bool {
	if isNull(raw) {
		return true
	}
	var d spmPart
	if json.Unmarshal(raw, &d) != nil {
		return true
	}
	if d.Type == "Sequence" && len(d.Decoders) == 1 {
		return isByteLevelDecoder(d.Decoders[0])
	}
	return d.Type == "ByteLevel"
}

// parseSPM reads the normalizer, pre-tokenizer and decoder of the
// SentencePiece-style path.
func parseSPM(f *tokenizerJSON) (*spmConfig, error) {
	c := &spmConfig{unk: -1}
	var err error
	if c.dec, err = parseSPMDecoder(f.Decoder); err != nil {
		return nil, err
	}
	if c.norm, err = parseSPMNormalizer(f.Normalizer, "normalizer"); err != nil {
		return nil, err
	}
	if c.meta, err = parseMetaspace(f.PreTokenizer, "pre_tokenizer"); err != nil {
		return nil, err
	}
	return c, nil
}

func parseSPMNormalizer(raw json.RawMessage, at string) ([]normStep, error) {
	if isNull(raw) {
		return nil, nil
	}
	var p spmPart
	if err := json.Unmarshal(raw, &p); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrTokenizer, at, err)
	}
	switch p.Type {
	case "Sequence":
		var out []normStep
		for i, q := range p.Normalizers {
			s, err := parseSPMNormalizer(q, fmt.Sprintf("%s %d", at, i))
			if err != nil {
				return nil, err
			}
			out = append(out, s...)
		}
		return out, nil
	case "Prepend":
		if p.Prepend == nil {
			return nil, fmt.Errorf("%w: %s: Prepend without prepend", ErrTokenizer, at)
		}
		return []normStep{{to: *p.Prepend}}, nil
	case "Replace":
		from, to, err := replaceStep(p, at)
		if err != nil {
			return nil, err
		}
		return []normStep{{from: from, to: to}}, nil
	}
	return nil, fmt.Errorf("%w: %s %s (want Prepend, Replace or a Sequence of them)", ErrUnsupported, at, typeOf(raw))
}

// replaceStep reads a Replace with a String pattern.
func replaceStep(p spmPart, at string) (from, to string, err error) {
	switch {
	case p.Pattern.Regex != nil:
		return "", "", fmt.Errorf("%w: %s: Replace with a Regex pattern (only String)", ErrUnsupported, at)
	case p.Pattern.String == nil || *p.Pattern.String == "":
		return "", "", fmt.Errorf("%w: %s: Replace without a String pattern", ErrTokenizer, at)
	case p.Content == nil || json.Unmarshal(*p.Content, &to) != nil:
		return "", "", fmt.Errorf("%w: %s: Replace without a string content", ErrTokenizer, at)
	}
	return *p.Pattern.String, to, nil
}

func parseMetaspace(raw json.RawMessage, at string) (*metaspace, error) {
	if isNull(raw) {
		return nil, nil
	}
	var p spmPart
	if err := json.Unmarshal(raw, &p); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrTokenizer, at, err)
	}
	if p.Type == "Sequence" && len(p.PreToks) == 1 {
		return parseMetaspace(p.PreToks[0], at+" 0")
	}
	if p.Type != "Metaspace" {
		return nil, fmt.Errorf("%w: %s %s (want Metaspace or null with a SentencePiece-style decoder)", ErrUnsupported, at, typeOf(raw))
	}
	m := &metaspace{rep: spmReplacement, mode: "always", split: true}
	if p.Replacement != nil {
		if utf8.RuneCountInString(*p.Replacement) != 1 {
			return nil, fmt.Errorf("%w: %s: Metaspace replacement %q is not one character", ErrTokenizer, at, *p.Replacement)
		}
		m.rep = *p.Replacement
	}
	switch {
	case p.PrependScheme != nil:
		m.mode = *p.PrependScheme
		if m.mode != "always" && m.mode != "first" && m.mode != "never" {
			return nil, fmt.Errorf("%w: %s: Metaspace prepend_scheme %q (want always, first or never)", ErrUnsupported, at, m.mode)
		}
	case p.AddPrefixSpace != nil && !*p.AddPrefixSpace:
		m.mode = "never"
	}
	if p.Split != nil {
		m.split = *p.Split
	}
	return m, nil
}

func parseSPMDecoder(raw json.RawMessage) ([]decStep, error) {
	var p spmPart
	if err := json.Unmarshal(raw, &p); err != nil {
		return nil, fmt.Errorf("%w: decoder: %v", ErrTokenizer, err)
	}
	parts := []json.RawMessage{raw}
	if p.Type == "Sequence" {
		parts = p.Decoders
	}
	var out []decStep
	for i, q := range parts {
		at := fmt.Sprintf("decoder %d", i)
		if err := json.Unmarshal(q, &p); err != nil {
			return nil, fmt.Errorf("%w: %s: %v", ErrTokenizer, at, err)
		}
		s := decStep{typ: p.Type}
		switch p.Type {
		case "Replace":
			var err error
			if s.from, s.to, err = replaceStep(p, at); err != nil {
				return nil, err
			}
		case "ByteFallback", "Fuse":
		case "Strip":
			var c string
			if p.Content == nil || json.Unmarshal(*p.Content, &c) != nil || utf8.RuneCountInString(c) != 1 {
				return nil, fmt.Errorf("%w: %s: Strip content is not one character", ErrTokenizer, at)
			}
			if p.Start < 0 || p.Stop < 0 {
				return nil, fmt.Errorf("%w: %s: Strip start %d, stop %d", ErrTokenizer, at, p.Start, p.Stop)
			}
			s.strip, _ = utf8.DecodeRuneInString(c)
			s.start, s.stop = p.Start, p.Stop
		case "Metaspace":
			m, err := parseMetaspace(q, at)
			if err != nil {
				return nil, err
			}
			s.from, s.to, s.prepend = m.rep, " ", m.mode != "never"
		default:
			want := "(want ByteLevel, Metaspace, or a Sequence of Replace, ByteFallback, Fuse, Strip and Metaspace)"
			if len(parts) == 1 {
				return nil, fmt.Errorf("%w: decoder %s %s", ErrUnsupported, typeOf(q), want)
			}
			return nil, fmt.Errorf("%w: %s: %s %s", ErrUnsupported, at, typeOf(q), want)
		}
		out = append(out, s)
	}
	return out, nil
}
