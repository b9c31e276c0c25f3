// Package node assembles one questrt cluster node: the gRPC server with
// the worker API (worker/remote: the shards of the sequences placed on
// this node), the client API (coord: the sequences coordinated
// here, forwarding for the others) and the standard health service; the
// membership (cluster: memberlist gossip, the node's meta with its gRPC
// address and free pages); and a connection pool to the other nodes.
// questd is this package plus flags; tests start several nodes in one
// process with it.
package node

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	decodev1 "github.com/questrt/questrt/api/decode/v1"
	"github.com/questrt/questrt/api/wire"
	workerv1 "github.com/questrt/questrt/api/worker/v1"
	"github.com/questrt/questrt/cluster"
	"github.com/questrt/questrt/coord"
	"github.com/questrt/questrt/engine"
	"github.com/questrt/questrt/kernels"
	"github.com/questrt/questrt/pagestore"
	"github.com/questrt/questrt/worker"
	"github.com/questrt/questrt/worker/remote"
)

// Config configures a node. Name (through Member), GRPCAddr, Engine and
// one of TLS and Plaintext are required.
type Config struct {
	// GRPCAddr is the listen address of the gRPC server ("127.0.0.1:0"
	// picks a free port). The server closes connections that say
	// nothing, stay idle or stop answering pings, and caps the streams of
	// one connection (defaultConnLimits).
	GRPCAddr string
	// Listener, when set, is the gRPC server's listener, bound beforehand
	// (on GRPCAddr): Start serves on it instead of listening itself, and
	// takes it over (closed when Start fails and at Stop). With
	// Member.Listener too, a server can bind every address it needs
	// before it starts anything. Default nil: Start listens on GRPCAddr.
	Listener net.Listener
	// Advertise is the host other nodes reach this node's gRPC server
	// and collective listeners at; default: the host of GRPCAddr.
	Advertise string
	// GRPCAdvertise, when set, is the host:port put in the node's meta
	// as its gRPC address, the one other nodes dial for its worker and
	// client APIs (and Addr): for a proxy or port mapping in front of
	// GRPCAddr. It changes nothing else (the collective listeners still
	// use Advertise). Default: Advertise (or the host of GRPCAddr) and
	// the port the server listens on.
	GRPCAdvertise string
	// Member configures the membership; its Name is the node's name, its
	// Meta is filled by Start.
	Member cluster.MemberConfig
	// Engine is the geometry, grid, policy, selection mode and step
	// deadline of the cluster (the same on every node).
	Engine engine.Config
	// MaxPages is the number of pages this node hosts over all grids
	// (default 8 x Engine.CapacityPages).
	MaxPages int
	// MemoryLimit bounds the host bytes of the hosted pools
	// (internal/memlimit: bytes, 0 available memory, -1 no check).
	MemoryLimit int64
	// TLS secures every gRPC connection (mutual TLS: Certificates,
	// RootCAs, ClientCAs, RequireAndVerifyClientCert); Plaintext runs
	// them unencrypted (only when asked for). Every connection, incoming
	// and outgoing (worker API clients, collective streams), handshakes
	// with a clone of TLS, so callbacks that read current material
	// (GetConfigForClient, GetClientCertificate, VerifyConnection: how
	// questd reloads on SIGHUP) change every new connection.
	//
	// Under TLS the node's coordinator places ranks only on members whose
	// gRPC server presents, under TLS, the node certificate of their
	// gossip name (questrt://node/NAME; a certificate without a role
	// passes unless RequireCertRoles); the others (a client certificate,
	// another node's, a plaintext server) are refused, with the reason in
	// Status (vet.go). A plaintext node refuses the members whose
	// metadata declares a TLS server (its connections could not reach
	// them).
	//
	// Start refuses a TLS whose own certificate its peers would refuse
	// (ownCertificate): one with a client role, another node's or a
	// malformed role URI. Rogue nodes for tests are made with the
	// test-only hook of export_test.go.
	TLS       *tls.Config
	Plaintext bool
	// foreignCert lets Start run with a certificate ownCertificate
	// refuses (tests only: a rogue joiner).
	foreignCert bool
	// Token, when set, is the bearer token of the cluster: every call of
	// the client API (questrt.decode.v1.Decode), the worker API and the
	// collective streams must carry the metadata "authorization: Bearer
	// <Token>" or fails UNAUTHENTICATED; nodes send it on their own calls,
	// so every node of a cluster needs the same Token. The health service
	// is not checked. Default "": none.
	Token string
	// RequireCertRoles, under TLS, refuses (PERMISSION_DENIED) every call
	// of the client and worker APIs and the collective streams whose
	// caller's certificate carries no questrt:// role URI SAN
	// (internal/identity). Default false: such a certificate counts as a
	// node's, and a warning is logged once per certificate. Whatever
	// this is, the worker API and the collective streams need a node
	// certificate, and a client certificate reaches the client API only
	// (guard).
	RequireCertRoles bool
	// DrainTimeout bounds how long Stop waits for in-flight calls (10s).
	DrainTimeout time.Duration
	// GridIdle is the coordinator's idle-grid timeout
	// (coord.Config.GridIdle; 0: grids stay open).
	GridIdle time.Duration
	// MetaInterval is how often the node checks its free pages and
	// updates its gossip meta when they changed (1s).
	MetaInterval time.Duration
	// Version is the version the node advertises.
	Version string
	// Logger receives every component's logs (default: discard).
	Logger *slog.Logger
	// Observe, when set, is called after every step this node
	// coordinates (coord.Config.Observe: concurrently, keep it quick).
	Observe func(coord.StepStats)
	// DataDir, Durability and SyncInterval make the grids hosted here
	// persistent (remote.ServerConfig's fields of the same name): Start
	// fails with remote.ErrDataDirInUse when another process holds
	// DataDir. Default "": nothing persists.
	DataDir string
	// DataDirLock, when set, is DataDir's lock taken beforehand
	// (remote.LockDataDir): Start takes it over (released at Stop, and
	// when Start fails), as it does Listener.
	DataDirLock  *remote.DataDirLock
	Durability   pagestore.Durability
	SyncInterval time.Duration
	// Verify and ScrubRate are when the grids' page stores check the
	// pages they recover, and their scrub's bytes per second
	// (remote.ServerConfig's fields of the same name).
	Verify    pagestore.Verify
	ScrubRate int64
	// OnPersistError, when set with DataDir, gets every failed operation
	// on a file of DataDir (remote.ServerConfig.OnPersistError).
	OnPersistError func(*pagestore.IOError)
	// OnQuarantine, when set with DataDir, gets every grid directory
	// found damaged and moved aside (remote.ServerConfig.OnQuarantine).
	OnQuarantine func(dir, movedTo string, err error)
	// Devices are the node's compute devices, one kernel backend each,
	// that the hosted ranks are placed over (remote.ServerConfig.Backends;
	// the caller keeps and closes them), with what the node advertises
	// about them (Status, membership meta). Empty: one CPU backend the
	// worker server owns.
	Devices []Device
	// DeviceResident keeps the hosted ranks' pools in their device's
	// memory (remote.ServerConfig.DeviceResident; needs Devices whose
	// backends are kernels.DeviceStores, and no DataDir).
	DeviceResident bool
}

// Device is one compute device of a node.
type Device struct {
	// Backend runs the kernels of the ranks placed on the device.
	Backend kernels.Backend
	// Kind is the backend's name ("cpu" or "cuda"); Name describes the
	// device (e.g. "GPU 0: NVIDIA H200"); MemoryBytes is its memory (0:
	// unknown).
	Kind, Name  string
	MemoryBytes uint64
}

// Stats is a snapshot of a node's state (Node.Stats).
type Stats struct {
	// Sequences is the number of sequences this node coordinates.
	Sequences int
	// GridsCoordinated is the number of grids this node's coordinator
	// drives; GridsHosted the number of grids (of any coordinator) with
	// ranks on this node.
	GridsCoordinated, GridsHosted int
	// PagesUsed and PagesFree are the pages of the grids hosted here and
	// the pages left of MaxPages.
	PagesUsed, PagesFree int
	// PagesDevice and PagesHost are the pages in use in the shards hosted
	// here, by tier: in a device pool, or only in a host tier (offload;
	// remote.Stats.PagesDevice).
	PagesDevice, PagesHost int
	// Offload is the hosted offloading shards' counters
	// (remote.Stats.Offload).
	Offload remote.OffloadTotals
	// Benches is the collective benchmark ranks held here, opened or
	// running (remote.Stats.Benches).
	Benches int
	// MembersUp is the number of members this node's view shows up
	// (alive or suspect), itself included.
	MembersUp int
	// Recovery is what the grids hosted here recovered from DataDir.
	Recovery remote.RecoveryStats
	// Serving reports whether the node serves: it has joined the
	// cluster, its gRPC server runs and Stop has not begun.
	Serving bool
}

// MaxMessageBytes bounds one gRPC message of the client and worker APIs.
// The elements of a request's repeated fields are bounded too, before it
// is decoded, by remote.MaxRequestElements(Config.MaxPages): a request
// past it is answered RESOURCE_EXHAUSTED (countingCodec).
const MaxMessageBytes = 256 << 20

// Node is a running node.
type Node struct {
	cfg    Config
	log    *slog.Logger
	lis    net.Listener
	addr   string
	ws     *remote.Server
	m      *cluster.Membership
	pool   *pool
	vet    *vetter // who may be placed on
	co     *coord.Coordinator
	ds     *coord.Server // the Decode service
	srv    *grpc.Server
	hs     *health.Server
	cancel context.CancelFunc
	wg     sync.WaitGroup
	served chan error
	once   sync.Once
	// swept decides which hosted grids' coordinators are gone (sweep).
	swept sweeper
	// serving is set once Start is done, cleared when Stop or Kill
	// begins.
	serving atomic.Bool
}

// Start starts a node: it listens, starts the worker service, joins the
// cluster (ctx bounds the join) and serves. Stop it with Stop.
func Start(ctx context.Context, cfg Config) (n *Node, err error) {
	defer func() {
		// The listeners handed in are Start's whatever happens.
		if err != nil {
			if cfg.Listener != nil {
				cfg.Listener.Close()
			}
			if cfg.Member.Listener != nil {
				cfg.Member.Listener.Close()
			}
			if cfg.DataDirLock != nil {
				cfg.DataDirLock.Close()
			}
		}
	}()
	if (cfg.TLS == nil) == !cfg.Plaintext {
		return nil, errors.New("node: set exactly one of TLS and Plaintext")
	}
	if cfg.TLS != nil && !cfg.foreignCert {
		if err := ownCertificate(cfg.Member.Name, cfg.TLS); err != nil {
			return nil, err
		}
	}
	if cfg.DrainTimeout <= 0 {
		cfg.DrainTimeout = 10 * time.Second
	}
	if cfg.MetaInterval <= 0 {
		cfg.MetaInterval = time.Second
	}
	if cfg.MaxPages <= 0 {
		cfg.MaxPages = 8 * cfg.Engine.CapacityPages
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	base := log // the membership names the node itself
	log = log.With("node", cfg.Member.Name)
	creds := insecure.NewCredentials()
	if cfg.TLS != nil {
		creds = credentials.NewTLS(cfg.TLS)
	}
	n = &Node{cfg: cfg, log: log, served: make(chan error, 1)}
	made := n // the error returns below set n to nil
	defer func() {
		if err != nil {
			made.close()
		}
	}()
	if n.lis = cfg.Listener; n.lis == nil {
		if n.lis, err = net.Listen("tcp", cfg.GRPCAddr); err != nil {
			return nil, fmt.Errorf("node: listen on %q: %w", cfg.GRPCAddr, err)
		}
	}
	host := cfg.Advertise
	if host == "" {
		host, _, _ = net.SplitHostPort(n.lis.Addr().String())
	}
	n.addr = net.JoinHostPort(host, strconv.Itoa(n.lis.Addr().(*net.TCPAddr).Port))
	if cfg.GRPCAdvertise != "" {
		n.addr = cfg.GRPCAdvertise
	}
	var bes []kernels.Backend
	for _, d := range cfg.Devices {
		bes = append(bes, d.Backend)
	}
	g := newGuard(cfg.Token, cfg.RequireCertRoles, log.With("component", "auth"))
	// Replies this node receives are bounded as the requests it serves
	// are, or by what a reply of one of its grids names, whichever is
	// larger (replyDial).
	replyLimit := max(remote.MaxRequestElements(cfg.MaxPages), remote.MaxReplyElements(worker.Config{CP: cfg.Engine.CP, TP: cfg.Engine.TP, Capacity: cfg.Engine.CapacityPages}))
	if n.ws, err = remote.NewServer(remote.ServerConfig{Host: host, MaxPages: cfg.MaxPages, MemoryLimit: cfg.MemoryLimit,
		TLS: cfg.TLS, Plaintext: cfg.Plaintext, Logger: log.With("component", "worker"),
		CollectiveServerOptions: g.serverOptions(), CollectiveDialOptions: append(tokenDial(cfg.Token), replyDial(replyLimit)),
		DataDir: cfg.DataDir, DataDirLock: cfg.DataDirLock, Durability: cfg.Durability, SyncInterval: cfg.SyncInterval, Verify: cfg.Verify, ScrubRate: cfg.ScrubRate, OnPersistError: cfg.OnPersistError, OnQuarantine: cfg.OnQuarantine,
		Backends: bes, DeviceResident: cfg.DeviceResident}); err != nil {
		return nil, fmt.Errorf("node: %w", err)
	}
	kind, ndev := "cpu", uint32(1)
	devices := []*decodev1.Device{{Kind: "cpu", Name: "host"}}
	if len(cfg.Devices) > 0 {
		kind, ndev, devices = cfg.Devices[0].Kind, uint32(len(cfg.Devices)), nil
		for _, d := range cfg.Devices {
			devices = append(devices, &decodev1.Device{Kind: d.Kind, Name: d.Name, MemoryBytes: d.MemoryBytes})
		}
	}
	mc := cfg.Member
	mc.Logger = base.With("component", "cluster")
	total := uint64(cfg.MaxPages)
	mc.Meta = cluster.NodeMeta{GRPCAddr: n.addr, Version: cfg.Version, Backend: kind, Devices: ndev, FreePages: total, TotalPages: total,
		Transport: cluster.TransportPlaintext}
	if cfg.TLS != nil {
		mc.Meta.Transport = cluster.TransportTLS
	}
	if n.m, err = cluster.NewMembership(ctx, mc); err != nil {
		return nil, fmt.Errorf("node: %w", err)
	}
	// The coordinator reaches this node's own worker server in process
	// (remote.Server.LocalConn), the other nodes over gRPC; with
	// GRPCAdvertise (a proxy or NAT in front of the node) its own calls
	// go through the advertised address too, as every node's do.
	n.pool = &pool{creds: creds, m: map[string]*grpc.ClientConn{}, dial: append(tokenDial(cfg.Token), replyDial(replyLimit))}
	if cfg.GRPCAdvertise == "" {
		n.pool.self, n.pool.local = n.addr, n.ws.LocalConn
	}
	n.vet = newVetter(mc.Name, cfg.TLS, cfg.RequireCertRoles, log.With("component", "vet"))
	if n.co, err = coord.New(coord.Config{Name: mc.Name, Instance: n.m.Instance(), Engine: cfg.Engine, View: n.m.View, Conn: n.pool.get, Vet: n.vet.vet,
		GridIdle: cfg.GridIdle, Logger: log.With("component", "coordinator"), Observe: cfg.Observe}); err != nil {
		return nil, fmt.Errorf("node: %w", err)
	}
	ds, err := coord.NewServer(coord.ServerConfig{Coordinator: n.co, Status: func(r *decodev1.StatusReply) {
		r.Version = cfg.Version
		r.Grids = uint32(n.ws.Grids())
		r.Devices = devices
		refused := n.vet.refusals(n.m.View())
		for _, m := range r.Members {
			m.Refused = refused[m.GetName()]
		}
	}})
	if err != nil {
		return nil, fmt.Errorf("node: %w", err)
	}
	// Static flow windows of serverWindow (serverFlowOptions), not
	// wire.ServerFlowOptions' 16 MiB: no BDP pings on the decode path,
	// and no more buffering per stream than gRPC's dynamic windows
	// allow any peer, authenticated or not.
	opts := append([]grpc.ServerOption{grpc.Creds(creds), grpc.MaxRecvMsgSize(MaxMessageBytes), grpc.MaxSendMsgSize(MaxMessageBytes)},
		defaultConnLimits().serverOptions()...)
	opts = append(opts, serverFlowOptions()...)
	opts = append(opts, g.serverOptions()...)
	// Inside the guard: errors of the client API name no addresses.
	opts = append(opts, redactor{log: log.With("component", "api")}.serverOptions()...)
	// Requests are counted before they are decoded (countingCodec); every
	// service registers through reg, which answers the refusals.
	codec := newCountingCodec(remote.MaxRequestElements(cfg.MaxPages))
	opts = append(opts, grpc.ForceServerCodecV2(codec))
	n.srv = grpc.NewServer(opts...)
	reg := boundedRegistrar{srv: n.srv, codec: codec}
	workerv1.RegisterWorkerServer(reg, n.ws)
	ds.Register(reg)
	n.ds = ds
	// Health says NOT_SERVING until the membership exists and every
	// server and loop runs, and again from the start of Stop.
	n.hs = health.NewServer()
	for _, svc := range healthServices() {
		n.hs.SetServingStatus(svc, healthpb.HealthCheckResponse_NOT_SERVING)
	}
	healthpb.RegisterHealthServer(reg, n.hs)
	n.wg.Go(func() { n.served <- n.srv.Serve(n.lis) })
	mctx, cancel := context.WithCancel(context.Background())
	n.cancel = cancel
	n.wg.Go(func() { n.advertise(mctx, mc.Meta) })
	_, sub := n.m.Subscribe(64)
	n.wg.Go(func() { n.watch(mctx, sub) })
	// Members are checked as they come, so that Status shows the refused
	// ones before any placement asks (on a plaintext node, only those
	// that declare TLS are checked, without a dial).
	_, vsub := n.m.Subscribe(16)
	n.wg.Go(func() { n.vet.watch(mctx, n.m.View, vsub) })
	for _, svc := range healthServices() {
		n.hs.SetServingStatus(svc, healthpb.HealthCheckResponse_SERVING)
	}
	n.serving.Store(true)
	log.Info("serving", "grpc", n.addr, "gossip", n.m.Addr().String())
	return n, nil
}

// healthServices are the service names the health service reports on:
// the whole server ("") and each API.
func healthServices() []string {
	return []string{"", decodev1.Decode_ServiceDesc.ServiceName, workerv1.Worker_ServiceDesc.ServiceName}
}

// Stats returns a snapshot of the node's state. It is safe to call at
// any time, during and after Stop included.
func (n *Node) Stats() Stats {
	ws := n.ws.Stats()
	return Stats{
		Sequences:        n.co.Sequences(),
		GridsCoordinated: n.co.Grids(),
		GridsHosted:      ws.Grids,
		PagesUsed:        ws.PagesUsed,
		PagesFree:        max(ws.PagesFree, 0),
		PagesDevice:      ws.PagesDevice,
		PagesHost:        ws.PagesHost,
		Offload:          ws.Offload,
		Benches:          ws.Benches,
		MembersUp:        len(n.m.View().Up()),
		Recovery:         ws.Recovery,
		Serving:          n.serving.Load(),
	}
}

// Serving reports whether the node serves: Start is done (the node has
// joined the cluster and its servers run) and Stop or Kill has not
// begun.
func (n *Node) Serving() bool { return n.serving.Load() }

// Name is the node's name.
func (n *Node) Name() string { return n.cfg.Member.Name }

// Addr is the node's advertised gRPC address.
func (n *Node) Addr() string { return n.addr }

// GossipAddr is the node's gossip address.
func (n *Node) GossipAddr() string { return n.m.Addr().String() }

// Membership is the node's membership.
func (n *Node) Membership() *cluster.Membership { return n.m }

// Coordinator is the node's coordinator: the sequences created through
// it are placed on grids of the cluster's workers, as those of the
// client API (questd's completions API uses it in process). Stop closes
// it.
func (n *Node) Coordinator() *coord.Coordinator { return n.co }

// Served receives the gRPC server's error if it stops
// serving before Stop.
func (n *Node) Served() <-chan error { return n.served }

// Stop drains the node: health NOT_SERVING, the in-flight calls end (up
// to DrainTimeout, then they are cut), the grids this node coordinates
// close on their nodes, the node leaves the cluster (ctx bounds the
// leave: when every node leaves at once nobody acknowledges, and the
// leave waits for ctx) and everything stops.
func (n *Node) Stop(ctx context.Context) error {
	var err error
	n.once.Do(func() {
		n.serving.Store(false)
		n.log.Info("draining", "timeout", n.cfg.DrainTimeout)
		n.hs.Shutdown()
		// The streams kept between decode steps (clients' Steps,
		// coordinators' Calls) end now, or after the step on them:
		// GracefulStop waits for every stream.
		n.ds.Drain()
		n.ws.Drain()
		stopped := make(chan struct{})
		go func() { n.srv.GracefulStop(); close(stopped) }()
		select {
		case <-stopped:
		case <-time.After(n.cfg.DrainTimeout):
			n.log.Warn("drain timed out; cutting the remaining calls")
			n.srv.Stop()
			<-stopped
		}
		n.co.Close()
		if lerr := n.m.Leave(ctx); lerr != nil {
			n.log.Warn("leave", "err", lerr)
		}
		err = n.close()
		n.log.Info("stopped")
	})
	return err
}

// Kill stops the node at once without leaving the cluster or closing
// its grids politely: to the others it looks like a crash (tests).
func (n *Node) Kill() {
	n.once.Do(func() {
		n.serving.Store(false)
		n.srv.Stop()
		n.close()
	})
}

// close releases everything Start made, in reverse order.
func (n *Node) close() error {
	if n.cancel != nil {
		n.cancel()
	}
	if n.srv != nil {
		n.srv.Stop()
	}
	if n.co != nil {
		n.co.Close()
	}
	if n.ws != nil {
		n.ws.Close()
	}
	if n.m != nil {
		n.m.Shutdown()
	}
	if n.pool != nil {
		n.pool.close()
	}
	if n.lis != nil {
		n.lis.Close()
	}
	n.wg.Wait()
	return nil
}

// watch reacts to every change of the membership view until ctx ends: the
// coordinator fails the steps in flight on grids that lost a node, and
// the grids of coordinators that are gone are closed here.
func (n *Node) watch(ctx context.Context, sub *cluster.Subscription) {
	defer sub.Close()
	for {
		select {
		case <-ctx.Done():
			return
		case _, ok := <-sub.Events():
			if !ok {
				return
			}
			n.co.CheckGrids()
			n.sweep()
		}
	}
}

// advertise updates the gossip meta when the free pages change.
func (n *Node) advertise(ctx context.Context, meta cluster.NodeMeta) {
	t := time.NewTicker(n.cfg.MetaInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n.sweep()
		free := uint64(max(n.ws.Stats().PagesFree, 0))
		if free == meta.FreePages {
			continue
		}
		meta.FreePages = free
		uctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		if err := n.m.UpdateMeta(uctx, meta); err != nil && ctx.Err() == nil {
			n.log.Warn("update meta", "err", err)
		}
		cancel()
	}
}

// sweep closes the hosted grids whose coordinator is gone from the view
// (dead, departed, or restarted as another instance; see sweeper):
// nobody will send them another call, and their pages are needed.
func (n *Node) sweep() {
	v := n.m.View()
	n.swept.observe(v)
	closed := n.ws.CloseGrids(func(id string) bool { return n.swept.gone(v, id) })
	if closed > 0 {
		n.log.Info("closed the grids of coordinators that are gone", "grids", closed)
	}
}

// pool caches one client connection per node address. The node's own
// address (self) gets local over the gRPC connection: its Worker API
// calls run in process, the rest go over gRPC.
type pool struct {
	creds credentials.TransportCredentials
	dial  []grpc.DialOption // added to every dial's (tokenDial)
	mu    sync.Mutex
	m     map[string]*grpc.ClientConn
	self  string
	local func(fallback grpc.ClientConnInterface) grpc.ClientConnInterface
	loc   grpc.ClientConnInterface
}

func (p *pool) get(addr string) (grpc.ClientConnInterface, error) {
	if addr == "" {
		return nil, errors.New("the node advertises no gRPC address")
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.m == nil {
		return nil, errors.New("node stopped")
	}
	if p.local != nil && addr == p.self && p.loc != nil {
		return p.loc, nil
	}
	cc, ok := p.m[addr]
	if !ok {
		var err error
		opts := append([]grpc.DialOption{grpc.WithTransportCredentials(p.creds),
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(MaxMessageBytes), grpc.MaxCallSendMsgSize(MaxMessageBytes))},
			wire.DialFlowOptions()...) // no BDP pings on the workers' replies
		opts = append(opts, p.dial...)
		cc, err = grpc.NewClient(addr, opts...)
		if err != nil {
			return nil, err
		}
		p.m[addr] = cc
	}
	if addr == p.self && p.local != nil {
		p.loc = p.local(cc)
		return p.loc, nil
	}
	return cc, nil
}

func (p *pool) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, cc := range p.m {
		cc.Close()
	}
	p.m = nil
}
