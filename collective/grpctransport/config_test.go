package grpctransport

import (
	"crypto/tls"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestDefaultConfig(t *testing.T) {
	c := DefaultConfig()
	c.Group, c.Peers, c.Plaintext = "g", []string{"127.0.0.1:0"}, true
	if err := c.Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	if c.KeepaliveMinTime > c.KeepaliveTime {
		t.Errorf("default KeepaliveMinTime %v > KeepaliveTime %v", c.KeepaliveMinTime, c.KeepaliveTime)
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name  string
		tweak func(c *Config)
		want  string // in the error; "" for valid
	}{
		{"ok", func(c *Config) {}, ""},
		{"tls", func(c *Config) { c.Plaintext, c.TLS = false, &tls.Config{} }, ""},
		{"no group", func(c *Config) { c.Group = "" }, "Group"},
		{"no peers", func(c *Config) { c.Peers = nil }, "Peers"},
		{"rank high", func(c *Config) { c.Rank = 2 }, "Rank"},
		{"rank negative", func(c *Config) { c.Rank = -1 }, "Rank"},
		{"empty peer", func(c *Config) { c.Peers[0] = "" }, "Peers[0]"},
		{"nowhere to listen", func(c *Config) { c.Peers[1] = "" }, "listen"},
		{"listen addr", func(c *Config) { c.Peers[1], c.ListenAddr = "", ":0" }, ""},
		{"no security", func(c *Config) { c.Plaintext = false }, "neither TLS nor Plaintext"},
		{"both security", func(c *Config) { c.TLS = &tls.Config{} }, "both"},
		{"max message 0", func(c *Config) { c.MaxMessageBytes = 0 }, "MaxMessageBytes"},
		{"max message huge", func(c *Config) { c.MaxMessageBytes = MaxMessageBytesLimit + 1 }, "MaxMessageBytes"},
		{"queue", func(c *Config) { c.SendQueue = 0 }, "SendQueue"},
		{"keepalive short", func(c *Config) { c.KeepaliveTime = time.Second }, "KeepaliveTime"},
		{"keepalive timeout", func(c *Config) { c.KeepaliveTimeout = 0 }, "KeepaliveTimeout"},
		{"min time 0", func(c *Config) { c.KeepaliveMinTime = 0 }, "KeepaliveMinTime"},
		{"min time over time", func(c *Config) { c.KeepaliveMinTime = 2 * c.KeepaliveTime }, "cut off"},
		{"close timeout", func(c *Config) { c.CloseTimeout = 0 }, "CloseTimeout"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultConfig()
			c.Group, c.Rank, c.Peers, c.Plaintext = "g", 1, []string{"node-a:7070", "node-b:7070"}, true
			tc.tweak(&c)
			err := c.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("Validate: %v, want nil", err)
			case tc.want != "" && (!errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("Validate: %v, want ErrConfig naming %q", err, tc.want)
			}
		})
	}
}
