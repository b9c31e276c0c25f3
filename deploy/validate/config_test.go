package validate

import (
	"os"
	"path/filepath"
	"testing"

	"sigs.k8s.io/yaml"
)

// readConfig reads a questd YAML config as a map of flag names to values.
func readConfig(t *testing.T, b []byte) map[string]any {
	t.Helper()
	var cfg map[string]any
	if err := yaml.Unmarshal(b, &cfg); err != nil {
		t.Fatalf("questd config: %v", err)
	}
	return cfg
}

// TestConfigFiles runs questd with every example config of deploy/config:
// every key must be a questd flag with a value it accepts, and the whole
// must pass questd's validation and start a node (alone, on free ports,
// with test TLS, gossip key and token files of mode 0600: see
// localOverrides). Each config ships TLS, a gossip key and a token
// (checkSecure).
func TestConfigFiles(t *testing.T) {
	files, err := filepath.Glob("../config/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no ../config/*.yaml")
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			cfg := readConfig(t, b)
			checkSecure(t, f, cfg)
			runQuestd(t, append([]string{"--config", f}, localOverrides(t, cfg)...), nil)
		})
	}
}
