package main

import (
	"encoding/base64"
	"errors"
	"fmt"
	"strings"

	"github.com/questrt/questrt/internal/readlimit"
)

// Limits of the files questd reads, checked from their size before they
// are read (a mistaken path to a large file is refused at once); PEM files: readlimit.MaxPEMFile.
const (
	maxConfigFile = 1 << 20  // --config
	maxSecretFile = 64 << 10 // --token-file, --gossip-key-file
)

// readGossipKeys reads the base64 keys of a gossip key file, one per
// line (blank lines and lines starting with '#' are skipped).
func readGossipKeys(path string) ([][]byte, error) {
	b, err := readlimit.ReadFile(path, maxSecretFile)
	if err != nil {
		return nil, errors.Unwrap(err)
	}
	var keys [][]byte
	for i, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, err := base64.StdEncoding.DecodeString(line)
		if err != nil {
			return nil, fmt.Errorf("line %d: not base64", i+1)
		}
		keys = append(keys, k)
	}
	if len(keys) == 0 {
		return nil, errors.New("no key in the file")
	}
	return keys, nil
}

// readToken reads the bearer token of a token file: its text with the
// surrounding whitespace trimmed, one token of printable ASCII without
// spaces (an HTTP/2 header value).
func readToken(path string) (string, error) {
	b, err := readlimit.ReadFile(path, maxSecretFile)
	if err != nil {
		return "", errors.Unwrap(err)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", errors.New("empty: want one token")
	}
	for _, r := range tok {
		if r <= ' ' || r > '~' {
			return "", errors.New("want one token of printable ASCII, no spaces or line breaks inside")
		}
	}
	return tok, nil
}
