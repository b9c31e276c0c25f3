// Package testmodels finds the shared test checkpoints
// (passkey-llama-v1 and -v2) for tests: $QUESTRT_MODELS, else
// shared/models in the working directory or one of its parents (the
// checkout's sibling ../shared/models from any package directory). For
// tests only.
package testmodels

import (
	"os"
	"path/filepath"
	"testing"
)

// Dir returns the directory holding passkey-llama-v1, or skips the test.
func Dir(tb testing.TB) string {
	tb.Helper()
	if d := os.Getenv("QUESTRT_MODELS"); d != "" && has(d) {
		return d
	}
	if wd, err := os.Getwd(); err == nil {
		for p := wd; ; p = filepath.Dir(p) {
			if d := filepath.Join(p, "shared", "models"); has(d) {
				return d
			}
			if filepath.Dir(p) == p {
				break
			}
		}
	}
	tb.Skip("test checkpoints not found (set QUESTRT_MODELS to the directory holding passkey-llama-v1)")
	return ""
}

func has(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, "passkey-llama-v1", "config.json"))
	return err == nil
}
