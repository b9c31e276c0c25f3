package main

import (
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/questrt/questrt/internal/certgen"
)

// upNodeName is the name of node i of a cluster called base.
func upNodeName(base string, i int) string { return fmt.Sprintf("%s-%d", base, i) }

// writeUpCerts makes a throwaway CA, a node certificate
// (questrt://node/NAME) for each of the count nodes called base-0.. and a
// client certificate (questrt://client/client) for the client
// (upClientName), and writes them in dir (internal/certgen).
func writeUpCerts(dir, base string, count int) error {
	ca, err := certgen.NewCA("questctl up " + base + " CA")
	if err != nil {
		return err
	}
	leaves := map[string]*certgen.Leaf{}
	if leaves[upClientName], err = ca.IssueClient(upClientName); err != nil {
		return err
	}
	for _, name := range nodeNames(base, count) {
		if leaves[name], err = ca.IssueNode(name); err != nil {
			return err
		}
	}
	return certgen.WriteFiles(dir, ca, leaves)
}

// upGossipKeyFile is the name of the gossip key file that up writes in
// its TLS directory.
const upGossipKeyFile = "gossip.key"

// gossipKeyBytes is the length of the gossip key up makes (AES-256).
const gossipKeyBytes = 32

// writeGossipKey writes a fresh random gossip key, base64 on one line as
// questd --gossip-key-file reads it, as dir/upGossipKeyFile (mode 0600,
// replaced atomically), and returns the file's path.
func writeGossipKey(dir string) (string, error) {
	key := make([]byte, gossipKeyBytes)
	if _, err := rand.Read(key); err != nil {
		return "", fmt.Errorf("gossip key: %w", err)
	}
	f, err := os.CreateTemp(dir, "."+upGossipKeyFile+"-") // mode 0600
	if err != nil {
		return "", fmt.Errorf("gossip key: %w", err)
	}
	_, werr := f.WriteString(base64.StdEncoding.EncodeToString(key) + "\n")
	if err := errors.Join(werr, f.Sync(), f.Close()); err != nil {
		os.Remove(f.Name())
		return "", fmt.Errorf("gossip key: %w", err)
	}
	path := filepath.Join(dir, upGossipKeyFile)
	if err := os.Rename(f.Name(), path); err != nil {
		os.Remove(f.Name())
		return "", fmt.Errorf("gossip key: %w", err)
	}
	return path, nil
}

// nodeNames are the names of a cluster's count nodes.
func nodeNames(base string, count int) []string {
	names := make([]string, count)
	for i := range names {
		names[i] = upNodeName(base, i)
	}
	return names
}

// prepareDataDirs makes the data directory of each node named in names,
// dir/NAME (absolute), creating dir and them (0700) when missing, and
// checks that a file can be created in each: the reason it cannot, one
// line, naming the directory, before any node starts.
func prepareDataDirs(dir string, names []string) ([]string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	dirs := make([]string, len(names))
	for i, name := range names {
		dirs[i] = filepath.Join(abs, name)
	}
	for _, d := range append([]string{abs}, dirs...) {
		fi, err := os.Stat(d)
		switch {
		case err == nil && !fi.IsDir():
			return nil, fmt.Errorf("%s is not a directory", d)
		case errors.Is(err, fs.ErrNotExist):
			if err := os.MkdirAll(d, 0o700); err != nil {
				return nil, fmt.Errorf("cannot create %s: %v", d, pathReason(err))
			}
		case err != nil:
			return nil, fmt.Errorf("cannot use %s: %v", d, pathReason(err))
		}
	}
	for _, d := range dirs {
		f, err := os.CreateTemp(d, ".questctl-up-probe-")
		if err != nil {
			return nil, fmt.Errorf("cannot write in %s: %v", d, pathReason(err))
		}
		f.Close()
		os.Remove(f.Name())
	}
	return dirs, nil
}

// pathReason is the reason of a file system error without the path it
// names (the caller names it).
func pathReason(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
