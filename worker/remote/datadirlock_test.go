package remote

import (
	"errors"
	"testing"
)

// TestDataDirLockHandedOn: a lock taken by LockDataDir keeps other
// lockers out, NewServer takes it over (the directory stays held while
// the server runs, and is free after its Close), a NewServer that fails
// releases the lock it was given, and a lock of another directory is
// refused.
func TestDataDirLockHandedOn(t *testing.T) {
	dir := t.TempDir()
	l, err := LockDataDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := LockDataDir(dir); !errors.Is(err, ErrDataDirInUse) {
		t.Fatalf("a second lock: %v, want ErrDataDirInUse", err)
	}
	cfg := DefaultServerConfig()
	cfg.DataDir, cfg.DataDirLock, cfg.Plaintext = dir, l, true
	s, err := NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	l.Close() // the server's now: nothing
	if _, err := LockDataDir(dir); !errors.Is(err, ErrDataDirInUse) {
		t.Fatalf("a lock while the server runs: %v, want ErrDataDirInUse", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	l, err = LockDataDir(dir)
	if err != nil {
		t.Fatalf("the lock after the server's Close: %v", err)
	}

	// Given with another directory: refused, and released.
	cfg.DataDir, cfg.DataDirLock = t.TempDir(), l
	if _, err := NewServer(cfg); err == nil {
		t.Fatal("NewServer took a lock of another directory")
	}
	l, err = LockDataDir(dir)
	if err != nil {
		t.Fatalf("the lock after a failed NewServer: %v", err)
	}
	l.Close()
}
