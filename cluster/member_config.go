package cluster

import (
	"errors"
	"fmt"
	"log"
	"log/slog"
	"math"
	"net/netip"
	"time"

	"github.com/hashicorp/memberlist"
)

// MemberConfig configures a node's [Membership]. Start from
// [DefaultMemberConfig], set Name (and usually BindAddr, Join and Meta),
// and check it with [MemberConfig.Validate]; [NewMembership] validates it
// too. The timings are memberlist's DefaultLANConfig unless said
// otherwise, and are exposed so that questd can make them flags.
type MemberConfig struct {
	// Name identifies the node in the cluster and must be unique in it:
	// 1 to 128 bytes of letters, digits, '.', '-' and '_'. No default.
	Name string

	// BindAddr is the IP address to listen on for gossip, over both UDP and
	// TCP. Default "0.0.0.0".
	BindAddr string
	// BindPort is the port to listen on. Default 7946. 0 picks a free port;
	// read it back with [Membership.Addr].
	BindPort int
	// AdvertiseAddr is the IP address other nodes reach this one at.
	// Default "": the bind address, or a private address of the machine
	// when binding to 0.0.0.0.
	AdvertiseAddr string
	// AdvertisePort is the port other nodes reach this one at. Default 0:
	// the bind port. With BindPort 0 it is always the port picked.
	AdvertisePort int
	// Listener, when set, is the gossip sockets bound beforehand by
	// [ListenGossip] on BindAddr and BindPort: [NewMembership] gossips on
	// them instead of binding its own (BindPort 0: the port they hold)
	// and takes them over, closing them when it fails and at Shutdown.
	// Default nil: NewMembership binds.
	Listener *GossipListener

	// Join lists the "host:port" gossip addresses of existing members that
	// [NewMembership] contacts. Empty starts a new cluster.
	Join []string
	// JoinRetryInterval is the pause between two rounds of join attempts
	// while none of Join answers, until the context of [NewMembership]
	// ends. Default 1s; 0 tries once.
	JoinRetryInterval time.Duration

	// Label is the cluster label (memberlist's Label): every packet and
	// stream carries it, and nodes with another label are refused. Default
	// "questrt"; at most 255 bytes; "" means no label.
	Label string
	// SecretKeys are the gossip encryption keys (AES, 16, 24 or 32 bytes
	// each): the first encrypts, all of them decrypt, so a key can be
	// rotated in by adding it second, then moving it first, then dropping
	// the old one. Empty means plaintext gossip. Nodes whose keys do not
	// match cannot join each other.
	SecretKeys [][]byte

	// ProbeInterval is the time between two failure-detection probes of a
	// random member. Default 1s.
	ProbeInterval time.Duration
	// ProbeTimeout is how long a direct probe waits for its ack before
	// indirect probes start; below ProbeInterval. Default 500ms.
	ProbeTimeout time.Duration
	// SuspicionMult scales how long a suspect member has to refute before
	// it is declared dead: SuspicionMult * max(1, log10(N)) *
	// ProbeInterval at least. Default 4.
	SuspicionMult int
	// SuspicionMaxTimeoutMult bounds the suspicion timeout at this many
	// times its minimum, used while confirmations from other members are
	// still expected. Default 6.
	SuspicionMaxTimeoutMult int
	// GossipInterval is the time between two gossip rounds (to 3 random
	// members), which spread joins, failures and meta updates. Default
	// 200ms.
	GossipInterval time.Duration
	// PushPullInterval is the time between two full state syncs with a
	// random member over TCP. Default 30s.
	PushPullInterval time.Duration
	// TCPTimeout bounds one TCP exchange: a join attempt, a push/pull, a
	// fallback probe. Default 10s.
	TCPTimeout time.Duration
	// DeadNodeReclaimTime is how long after a member is declared dead
	// another node may take over its name from a different address (a
	// restarted node on a new address or port). 0 means only after
	// memberlist forgets the dead node (30s). Default 100ms: a node
	// restarted on a new address is taken in as soon as the others know
	// its old process dead (names are unique by configuration, so a new
	// address claiming a dead name is a restart, not an impostor).
	DeadNodeReclaimTime time.Duration
	// BroadcastTimeout bounds [Membership.UpdateMeta] and
	// [Membership.Leave] waiting for their broadcast when their context has
	// no deadline. Default 5s.
	BroadcastTimeout time.Duration
	// DeadRetention is how long a dead or departed member stays in
	// [Membership.Members] and the [View] before it is forgotten (with an
	// [EventRemoved], at the next change of the view: no timer runs for
	// it); a member that comes back is listed again. Default 10m.
	DeadRetention time.Duration

	// Meta is the metadata this node advertises at start; change it later
	// with [Membership.UpdateMeta].
	Meta NodeMeta

	// Logger receives this package's logs and memberlist's, bridged (with
	// component=memberlist and memberlist's level mapped to slog's). nil
	// discards them.
	Logger *slog.Logger
}

// ErrInvalidConfig means a [MemberConfig] field breaks its rule.
var ErrInvalidConfig = errors.New("invalid member config")

// DefaultMemberConfig returns the defaults documented on each field of
// [MemberConfig]. Name is left empty: every node must set its own.
func DefaultMemberConfig() MemberConfig {
	lan := memberlist.DefaultLANConfig()
	return MemberConfig{
		BindAddr:                "0.0.0.0",
		BindPort:                7946,
		JoinRetryInterval:       time.Second,
		Label:                   "questrt",
		ProbeInterval:           lan.ProbeInterval,
		ProbeTimeout:            lan.ProbeTimeout,
		SuspicionMult:           lan.SuspicionMult,
		SuspicionMaxTimeoutMult: lan.SuspicionMaxTimeoutMult,
		GossipInterval:          lan.GossipInterval,
		PushPullInterval:        lan.PushPullInterval,
		TCPTimeout:              lan.TCPTimeout,
		DeadNodeReclaimTime:     100 * time.Millisecond,
		BroadcastTimeout:        5 * time.Second,
		DeadRetention:           10 * time.Minute,
	}
}

// maxNameLen bounds [MemberConfig.Name].
const maxNameLen = 128

// Validate reports the first field that breaks its rule, wrapping
// [ErrInvalidConfig] (and [ErrMetaTooLarge] or [ErrInvalidMeta] for Meta).
func (c MemberConfig) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("cluster: %w: %s", ErrInvalidConfig, fmt.Sprintf(format, args...))
	}
	if err := validName(c.Name); err != nil {
		return bad("name: %v", err)
	}
	if _, err := netip.ParseAddr(c.BindAddr); err != nil {
		return bad("bind address %q: not an IP address", c.BindAddr)
	}
	if c.BindPort < 0 || c.BindPort > 65535 {
		return bad("bind port %d: want 0-65535", c.BindPort)
	}
	if c.AdvertiseAddr != "" {
		if _, err := netip.ParseAddr(c.AdvertiseAddr); err != nil {
			return bad("advertise address %q: not an IP address", c.AdvertiseAddr)
		}
	}
	if c.AdvertisePort < 0 || c.AdvertisePort > 65535 {
		return bad("advertise port %d: want 0-65535", c.AdvertisePort)
	}
	for i, a := range c.Join {
		if a == "" {
			return bad("join address %d is empty", i)
		}
	}
	if c.JoinRetryInterval < 0 {
		return bad("join retry interval %v < 0", c.JoinRetryInterval)
	}
	if len(c.Label) > memberlist.LabelMaxSize {
		return bad("label is %d bytes, limit %d", len(c.Label), memberlist.LabelMaxSize)
	}
	for i, k := range c.SecretKeys {
		if err := memberlist.ValidateKey(k); err != nil {
			return bad("secret key %d: %v", i, err)
		}
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"probe interval", c.ProbeInterval}, {"probe timeout", c.ProbeTimeout},
		{"gossip interval", c.GossipInterval}, {"push/pull interval", c.PushPullInterval},
		{"TCP timeout", c.TCPTimeout}, {"broadcast timeout", c.BroadcastTimeout},
		{"dead retention", c.DeadRetention},
	} {
		if d.v <= 0 {
			return bad("%s %v: must be > 0", d.name, d.v)
		}
	}
	if c.ProbeTimeout >= c.ProbeInterval {
		return bad("probe timeout %v must be below probe interval %v", c.ProbeTimeout, c.ProbeInterval)
	}
	if c.SuspicionMult < 1 {
		return bad("suspicion multiplier %d < 1", c.SuspicionMult)
	}
	if c.SuspicionMaxTimeoutMult < 1 {
		return bad("suspicion max timeout multiplier %d < 1", c.SuspicionMaxTimeoutMult)
	}
	if c.DeadNodeReclaimTime < 0 {
		return bad("dead node reclaim time %v < 0", c.DeadNodeReclaimTime)
	}
	if err := c.Meta.validate(); err != nil {
		return fmt.Errorf("cluster: %w: meta: %w", ErrInvalidConfig, err)
	}
	return nil
}

func validName(s string) error {
	if s == "" {
		return errors.New("empty")
	}
	if len(s) > maxNameLen {
		return fmt.Errorf("%d bytes, limit %d", len(s), maxNameLen)
	}
	for _, c := range []byte(s) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '-' || c == '_') {
			return fmt.Errorf("%q: only letters, digits, '.', '-' and '_'", s)
		}
	}
	return nil
}

// DetectionBound estimates, from the timings, the longest time a cluster
// of n members (n >= 2) takes to declare a killed member dead on every
// survivor, while the survivors are healthy: a survivor probes each
// member at least once in 2(n-1) probe intervals (a shuffled round robin),
// a failed probe takes one more interval (direct, indirect and TCP
// fallback), the suspicion timeout follows (memberlist's minimum, or its
// maximum where confirmations are expected), and a few gossip rounds carry
// the verdict to the others. A survivor that misses its own deadlines
// stretches its probe interval up to 8 times (memberlist's awareness), so
// on a loaded machine the real time can exceed it.
func (c MemberConfig) DetectionBound(n int) time.Duration {
	n = max(n, 2)
	reach := time.Duration(2*(n-1)) * c.ProbeInterval
	susp := suspicionTimeout(c, n)
	spread := time.Duration(3*math.Ceil(math.Log10(float64(n+1)))+1) * c.GossipInterval
	return reach + c.ProbeInterval + susp + spread
}

// suspicionTimeout is the timeout memberlist v0.7.0 gives a suspicion in a
// cluster of n (state.go suspectNode, util.go suspicionTimeout).
func suspicionTimeout(c MemberConfig, n int) time.Duration {
	scale := math.Max(1, math.Log10(math.Max(1, float64(n))))
	lo := time.Duration(c.SuspicionMult) * time.Duration(scale*1000) * c.ProbeInterval / 1000
	k := c.SuspicionMult - 2
	if n-2 < k {
		k = 0
	}
	if k < 1 {
		return lo
	}
	return time.Duration(c.SuspicionMaxTimeoutMult) * lo
}

// memberlistConfig translates c into memberlist's configuration, with d as
// every delegate and the log bridged into logger.
func (c MemberConfig) memberlistConfig(d *delegate, logger *log.Logger) (*memberlist.Config, error) {
	mc := memberlist.DefaultLANConfig()
	mc.Name = c.Name
	mc.BindAddr = c.BindAddr
	mc.BindPort = c.BindPort
	if c.Listener != nil {
		mc.Transport = c.Listener.nt
		mc.BindPort = c.Listener.Port()
	}
	mc.AdvertiseAddr = c.AdvertiseAddr
	mc.AdvertisePort = c.AdvertisePort
	if c.AdvertisePort == 0 {
		mc.AdvertisePort = mc.BindPort
	}
	mc.Label = c.Label
	mc.SkipInboundLabelCheck = false
	if len(c.SecretKeys) > 0 {
		kr, err := memberlist.NewKeyring(c.SecretKeys, c.SecretKeys[0])
		if err != nil {
			return nil, fmt.Errorf("keyring: %w", err)
		}
		mc.Keyring = kr
		mc.GossipVerifyIncoming = true
		mc.GossipVerifyOutgoing = true
	}
	mc.ProbeInterval = c.ProbeInterval
	mc.ProbeTimeout = c.ProbeTimeout
	mc.SuspicionMult = c.SuspicionMult
	mc.SuspicionMaxTimeoutMult = c.SuspicionMaxTimeoutMult
	mc.GossipInterval = c.GossipInterval
	mc.PushPullInterval = c.PushPullInterval
	mc.TCPTimeout = c.TCPTimeout
	mc.DeadNodeReclaimTime = c.DeadNodeReclaimTime
	mc.Delegate = d
	mc.Events = d
	mc.Conflict = d
	mc.Ping = d
	mc.Logger = logger
	mc.LogOutput = nil
	return mc, nil
}
