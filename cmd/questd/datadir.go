package main

import (
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
)

// logDataDir says at start what --data-dir holds: the coordinators whose
// grids persisted there and how many grid directories each, and that
// their sequences come back only when a grid of the same config opens
// here (a Create, or the client API's Recovered), under the coordinator
// of that name: a node restarted under another --name does not adopt its
// old sequences.
func logDataDir(dir, name string, log *slog.Logger) {
	if dir == "" {
		return
	}
	root := filepath.Join(dir, "grids")
	owners, err := os.ReadDir(root)
	if errors.Is(err, fs.ErrNotExist) {
		log.Info("data dir: nothing persisted yet", "data_dir", dir)
		return
	}
	if err != nil {
		log.Warn("data dir: cannot list the persisted grids", "data_dir", dir, "err", err)
		return
	}
	counts := map[string]int{}
	mine := false
	for _, o := range owners {
		if !o.IsDir() {
			continue
		}
		gs, err := os.ReadDir(filepath.Join(root, o.Name()))
		if err != nil {
			continue
		}
		counts[o.Name()] = len(gs)
		mine = mine || o.Name() == name
	}
	if len(counts) == 0 {
		log.Info("data dir: nothing persisted yet", "data_dir", dir)
		return
	}
	log.Info("data dir: persisted grids found; their sequences are recovered and adopted when a grid of their config and placement opens here (a Create, or the client API's Recovered: questctl status lists them then)",
		"data_dir", dir, "grids_by_coordinator", counts)
	if !mine {
		log.Warn("data dir: no grid of this node's own coordinator: a node restarted under another --name does not adopt its old sequences (the coordinators named above do, when they open their grids here)",
			"data_dir", dir, "name", name)
	}
}
