package main

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestDevicesJSON: devices --json prints one valid JSON object whatever
// the machine has (a GPU list, or an empty one with the reason), and the
// text form is one line when there is no GPU.
func TestDevicesJSON(t *testing.T) {
	code, stdout, stderr := runCLI(t, "devices", "--json")
	if code != 0 || stderr != "" {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
	var v struct {
		GPUs   []json.RawMessage `json:"gpus"`
		Reason string            `json:"reason"`
	}
	if err := json.Unmarshal([]byte(stdout), &v); err != nil {
		t.Fatalf("not JSON: %v: %q", err, stdout)
	}
	if v.GPUs == nil {
		t.Fatalf("no gpus array: %q", stdout)
	}
	if len(v.GPUs) == 0 && v.Reason == "" {
		t.Fatalf("no GPU and no reason: %q", stdout)
	}
	if len(v.GPUs) == 0 {
		code, stdout, _ = runCLI(t, "devices")
		if code != 0 || strings.Count(stdout, "\n") != 1 {
			t.Fatalf("text form: exit %d, %q", code, stdout)
		}
	}
}
