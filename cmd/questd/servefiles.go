package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// checkServeFiles looks at --model and --chat-template once, before
// anything starts (the completions API loads them after the node has
// started), so that a checkpoint directory without config.json or a
// template that is missing or a directory is a configuration error
// (exit 2, one line naming the flag and the path) rather than a failure
// to serve. A file that is there but does not load still fails later.
func checkServeFiles(cfg Config) error {
	if m := cfg.Serve.Model; m != "" {
		f, err := os.Open(filepath.Join(m, "config.json"))
		if err != nil {
			return fmt.Errorf("--model %q: %w (want a checkpoint directory holding config.json)", m, err)
		}
		f.Close()
	}
	if t := cfg.Serve.ChatTemplate; t != "" {
		fi, err := os.Stat(t)
		if err == nil && fi.IsDir() {
			err = errors.New("is a directory")
		}
		if err != nil {
			return fmt.Errorf("--chat-template %q: %w", t, err)
		}
	}
	return nil
}
