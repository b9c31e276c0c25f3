package remote

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/questrt/questrt/internal/memlimit"
	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/pagestore"
	"google.golang.org/grpc"
)

// ServerConfig configures a node's worker server. DefaultServerConfig
// gives the defaults; set one of TLS and Plaintext.
type ServerConfig struct {
	// Host is the IP or host name the grids' collective listeners bind
	// to and advertise to their peers (one ephemeral port per hosted
	// rank). Default "127.0.0.1".
	Host string
	// MaxPages bounds the pages this node hosts over all its grids (a
	// grid takes its Capacity pages per hosted rank); an OpenGrid beyond
	// it fails with ErrNodeFull (RESOURCE_EXHAUSTED). 0: no bound but
	// MemoryLimit.
	MaxPages int
	// MemoryLimit bounds the host bytes of all grids' page pools and
	// summary mirrors together, as internal/memlimit counts them: a byte
	// count, 0 (the memory available when a grid opens) or -1 (no check).
	// It is every grid's worker.Config.MemoryLimit too.
	MemoryLimit int64
	// DeviceResident keeps the grids' pools in the backend's device
	// memory (worker.Config.DeviceResident).
	DeviceResident bool
	// TLS secures the collective transports between the grids' ranks
	// (grpctransport.Config.TLS); Plaintext runs them unencrypted, only
	// when asked for. Exactly one must be set. The worker API's own gRPC
	// server is the caller's (grpc.NewServer with its credentials).
	TLS       *tls.Config
	Plaintext bool
	// CollectiveServerOptions and CollectiveDialOptions are added to the
	// options of every hosted rank's collective transport
	// (grpctransport.Config.ServerOptions and DialOptions): a node's
	// authorization interceptors and the token its own streams carry.
	CollectiveServerOptions []grpc.ServerOption
	CollectiveDialOptions   []grpc.DialOption
	// Backend runs every hosted rank's kernels; it must be safe for
	// concurrent use by several ranks. Nil: a CPU backend the server owns
	// and closes.
	Backend kernels.Backend
	// Backends, when not empty, are the node's devices, one backend each
	// (Backend must then be nil): each hosted rank of a grid is placed on
	// the device holding the fewest hosted ranks of the open grids at that
	// moment (ties to the lower index), so that a grid's ranks spread over
	// the devices and several ranks share a device when there are more
	// ranks than devices. The caller keeps and closes them.
	Backends []kernels.Backend
	// Logger receives the server's and the transports' logs. Default:
	// discard.
	Logger *slog.Logger
	// ConnectTimeout bounds ConnectGrid's wait for a grid's peers, and
	// the time from OpenGrid to ConnectGrid: a grid not connected by then
	// is freed by the next call that notices. Default 10 s.
	ConnectTimeout time.Duration
	// DataDir, when set, makes the grids persistent: each grid's worker
	// persists under DataDir/grids/<coordinator>/<shape>.<n>
	// (worker.Config.DataDir; see persist.go for the names), a directory
	// derived from the grid's coordinator name, page geometry, CP x TP,
	// pages per rank and hosted ranks, so that the same coordinator
	// opening a grid of the same shape after a restart (of this node or
	// its own) recovers the grid's sequences (parked, see
	// worker.RecoveryReport; ConnectGrid logs the report and Stats
	// counts it). Closing a grid persists it in full; nothing deletes
	// a grid's directory. The server holds DataDir/LOCK for its life: a
	// second server on the directory, in any process, fails with
	// ErrDataDirInUse. Not with DeviceResident. "" (the default):
	// nothing persists.
	DataDir string
	// DataDirLock, when set, is DataDir's lock taken beforehand
	// ([LockDataDir] on DataDir): NewServer takes it over instead of
	// locking (released at Close, and when NewServer fails). Default
	// nil: NewServer locks DataDir.
	DataDirLock *DataDirLock
	// Durability and SyncInterval are the grids' page store durability
	// (worker.Config.Durability, SyncInterval); unused without DataDir.
	Durability   pagestore.Durability
	SyncInterval time.Duration
	// Verify and ScrubRate are when the grids' page stores read and
	// check the pages they recover, and their background scrub's bytes
	// per second (worker.Config.Verify, ScrubRate); unused without
	// DataDir.
	Verify    pagestore.Verify
	ScrubRate int64
	// OnPersistError, when set with DataDir, gets every failed operation
	// on a file of DataDir (worker.Config.OnPersistError of every grid).
	OnPersistError func(*pagestore.IOError)
	// OnQuarantine, when set with DataDir, gets every grid directory
	// found damaged and moved aside (its path and where it went).
	OnQuarantine func(dir, movedTo string, err error)
}

// DefaultConnectTimeout is ServerConfig.ConnectTimeout's default.
const DefaultConnectTimeout = 10 * time.Second

// DefaultServerConfig returns the defaults; set TLS or Plaintext.
func DefaultServerConfig() ServerConfig {
	return ServerConfig{Host: "127.0.0.1", ConnectTimeout: DefaultConnectTimeout}
}

// Validate reports the first invalid field.
func (c ServerConfig) Validate() error {
	switch {
	case c.Host == "":
		return errors.New("worker server config: empty Host")
	case c.MaxPages < 0:
		return fmt.Errorf("worker server config: MaxPages %d is negative", c.MaxPages)
	case c.MemoryLimit < memlimit.NoLimit:
		return fmt.Errorf("worker server config: memory limit %d: want bytes, 0 (available memory) or -1 (no check)", c.MemoryLimit)
	case (c.TLS != nil) == c.Plaintext:
		return errors.New("worker server config: set exactly one of TLS and Plaintext")
	case c.ConnectTimeout <= 0:
		return fmt.Errorf("worker server config: ConnectTimeout %v must be positive", c.ConnectTimeout)
	case c.DataDir != "" && c.DeviceResident:
		return fmt.Errorf("worker server config: data dir %s with device-resident pools: the device-resident store does not persist", c.DataDir)
	case c.Backend != nil && len(c.Backends) > 0:
		return errors.New("worker server config: set Backend or Backends, not both")
	case slices.Contains(c.Backends, nil):
		return errors.New("worker server config: a nil backend in Backends")
	case c.Durability < pagestore.SyncOnWrite || c.Durability > pagestore.SyncPeriodic:
		return fmt.Errorf("worker server config: unknown durability %d", int(c.Durability))
	case c.SyncInterval < 0:
		return fmt.Errorf("worker server config: sync interval %v must not be negative", c.SyncInterval)
	case c.Verify < pagestore.VerifyAtOpen || c.Verify > pagestore.VerifyOnRead:
		return fmt.Errorf("worker server config: unknown verify mode %d", int(c.Verify))
	}
	return nil
}
