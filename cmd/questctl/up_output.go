package main

import (
	"bytes"
	"io"
	"strings"
	"sync"
)

// shellQuote quotes s for a POSIX shell when it needs it.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_./:@%+=,-") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// syncWriter serializes writes to w.
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

// prefixWriter writes whole lines to out, each starting with prefix.
type prefixWriter struct {
	out    io.Writer
	prefix string
	mu     sync.Mutex
	buf    []byte
}

func (p *prefixWriter) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.buf = append(p.buf, b...)
	for {
		i := bytes.IndexByte(p.buf, '\n')
		if i < 0 {
			return len(b), nil
		}
		// A failing stderr must not stop the node's output being read.
		io.WriteString(p.out, p.prefix+string(p.buf[:i+1]))
		p.buf = p.buf[i+1:]
	}
}

// flush writes a last unterminated line.
func (p *prefixWriter) flush() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.buf) == 0 {
		return nil
	}
	_, err := io.WriteString(p.out, p.prefix+string(p.buf)+"\n")
	p.buf = nil
	return err
}
