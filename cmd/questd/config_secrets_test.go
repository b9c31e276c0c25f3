package main

import (
	"bytes"
	"encoding/base64"
	"reflect"
	"strings"
	"testing"
)

// TestGossipKeys: the key file holds base64 keys, one per line, the
// first encrypting; they reach the member config.
func TestGossipKeys(t *testing.T) {
	k1, k2 := bytes.Repeat([]byte{1}, 32), bytes.Repeat([]byte{2}, 16)
	p := writeFile(t, "gossip.key", "# current first\n"+base64.StdEncoding.EncodeToString(k1)+"\n\n"+base64.StdEncoding.EncodeToString(k2)+"\n")
	c, err := load(t, nil, "--plaintext", "--gossip-key-file", p)
	if err != nil {
		t.Fatal(err)
	}
	if m := c.memberConfig(); !reflect.DeepEqual(m.SecretKeys, [][]byte{k1, k2}) {
		t.Errorf("secret keys %x", m.SecretKeys)
	}
	for _, text := range []string{"", "# none\n"} {
		_, err := load(t, nil, "--plaintext", "--gossip-key-file", writeFile(t, "k", text))
		if err == nil || !strings.Contains(err.Error(), "no key") {
			t.Errorf("key file %q: %v", text, err)
		}
	}
}
