package node

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/questrt/questrt/cluster"
	"github.com/questrt/questrt/internal/identity"
)

// ErrRefusedMember means a member of the gossip layer is never placed
// on: its gRPC identity is not the node certificate of its gossip name,
// or its gRPC address cannot be reached under the cluster's TLS. The
// gossip layer admits anyone with its label and key; placement admits
// only the members that prove, on the gRPC connection ranks travel over,
// that they are the node they claim to be.
var ErrRefusedMember = errors.New("member refused")

// vetTimeout bounds one check of a member (TCP connect and TLS
// handshake).
const vetTimeout = 3 * time.Second

// vetRetry is how long a refusal stands before the member is checked
// again (a node whose server was still starting, a certificate
// replaced); an admission stands while the member keeps its instance
// and gRPC address.
const vetRetry = 5 * time.Second

// vetter decides which members this node's coordinator may place ranks
// on, and remembers why it refused the others (Status shows it). Under
// TLS it dials a member's advertised gRPC address with the node's TLS
// config (the cluster's CA, this node's certificate) and admits it only
// when the certificate it presents is questrt://node/NAME for its
// gossip NAME (checkIdentity); a member whose metadata declares a
// plaintext server is refused without a dial, and a plaintext node that
// does not say (older than the field) fails the handshake. A
// plaintext node (tls nil) has no identities to check: it admits every
// member except one whose metadata declares a TLS server, which none of
// its connections could reach (refused without a dial, the reason in
// Status, as the other way round). This node itself is always
// admitted. Verdicts are kept per member
// name, for one instance and gRPC address: a member restarted or moved
// is checked again. Methods are safe for concurrent use; vet blocks for
// one check at most (vetTimeout), and concurrent callers of one member
// share its check.
type vetter struct {
	self         string
	tls          *tls.Config
	requireRoles bool
	timeout      time.Duration
	retry        time.Duration
	log          *slog.Logger
	now          func() time.Time

	mu  sync.Mutex
	get map[string]*verdict // by member name
}

// verdict is one check of one member.
type verdict struct {
	instance uint64
	addr     string
	done     chan struct{} // closed when err and at are set
	err      error         // nil: admitted
	at       time.Time
	logged   string // the refusal last logged for this member
	// prev is the refusal this check repeats (same instance and
	// address), shown by refusals while the check runs.
	prev error
}

func newVetter(self string, cfg *tls.Config, requireRoles bool, log *slog.Logger) *vetter {
	return &vetter{self: self, tls: cfg, requireRoles: requireRoles, timeout: vetTimeout, retry: vetRetry,
		log: log, now: time.Now, get: map[string]*verdict{}}
}

// vet returns nil when m may be placed on, else an error wrapping
// ErrRefusedMember that says why. It checks m when no verdict about its
// current instance and address stands; ctx ending before the check is
// done returns ctx's error and records nothing.
func (v *vetter) vet(ctx context.Context, m cluster.Member) error {
	if m.Name == v.self || v.tls == nil && m.Meta.Transport != cluster.TransportTLS {
		return nil
	}
	for {
		v.mu.Lock()
		d := v.get[m.Name]
		fresh := d != nil && d.instance == m.Instance && d.addr == m.Meta.GRPCAddr
		if fresh {
			select {
			case <-d.done:
				if d.err == nil || v.now().Sub(d.at) < v.retry {
					v.mu.Unlock()
					return d.err
				}
				fresh = false // a refusal that has stood long enough: check again
			default:
			}
		}
		if fresh { // a check in flight: share it
			v.mu.Unlock()
			select {
			case <-d.done:
				continue
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		nd := &verdict{instance: m.Instance, addr: m.Meta.GRPCAddr, done: make(chan struct{})}
		if d != nil && d.instance == nd.instance && d.addr == nd.addr {
			nd.logged, nd.prev = d.logged, d.err
		}
		v.get[m.Name] = nd
		v.mu.Unlock()

		cctx, cancel := context.WithTimeout(ctx, v.timeout)
		err := v.check(cctx, m)
		cancel()
		v.mu.Lock()
		if ctx.Err() != nil {
			// The caller gave up: no verdict (the next caller checks).
			if v.get[m.Name] == nd {
				delete(v.get, m.Name)
			}
			nd.err = ctx.Err()
			close(nd.done)
			v.mu.Unlock()
			return ctx.Err()
		}
		nd.err, nd.at = err, v.now()
		close(nd.done)
		logIt := err != nil && err.Error() != nd.logged
		if logIt {
			nd.logged = err.Error()
		}
		v.mu.Unlock()
		if logIt {
			v.log.Warn("a member is refused: no ranks are placed on it", "member", m.Name, "grpc", m.Meta.GRPCAddr, "why", err)
		}
		return err
	}
}

// check refuses m when this node runs plaintext (vet asks then only
// about members that declare TLS), or when m's metadata declares a
// plaintext gRPC server (this node runs TLS: no rank of its grids could
// reach it), else dials
// its gRPC address under the node's TLS config and checks the identity
// of the certificate the server presents against its name. A member
// that declares no transport (a node older than the field) is dialled.
func (v *vetter) check(ctx context.Context, m cluster.Member) error {
	name, addr := m.Name, m.Meta.GRPCAddr
	if v.tls == nil {
		// vet asks only about members that declare TLS.
		return fmt.Errorf("%w: it serves gRPC over TLS (its gossip metadata says so) and this node runs plaintext", ErrRefusedMember)
	}
	if m.Meta.Transport == cluster.TransportPlaintext {
		return fmt.Errorf("%w: it serves gRPC in plaintext (its gossip metadata says so) and this node runs mutual TLS", ErrRefusedMember)
	}
	if addr == "" {
		return fmt.Errorf("%w: it advertises no gRPC address", ErrRefusedMember)
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%w: its gRPC address %q: %v", ErrRefusedMember, addr, err)
	}
	cfg := v.tls.Clone()
	if cfg.ServerName == "" {
		cfg.ServerName = host // as gRPC does: the certificate must name the address
	}
	cfg.NextProtos = []string{"h2"}
	d := tls.Dialer{Config: cfg}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("%w: cannot reach its gRPC address %s under TLS: %v", ErrRefusedMember, addr, err)
	}
	state := conn.(*tls.Conn).ConnectionState()
	conn.Close()
	if len(state.PeerCertificates) == 0 {
		return fmt.Errorf("%w: its gRPC server at %s presented no certificate", ErrRefusedMember, addr)
	}
	return checkIdentity(name, state.PeerCertificates[0], v.requireRoles)
}

// checkIdentity returns nil when cert, presented by the gRPC server of
// the member called name, is that node's: its role URI SAN is
// questrt://node/NAME. A certificate without a role (issued before
// roles) is admitted unless requireRoles, as the guard admits it on the
// worker API. Anything else wraps ErrRefusedMember: a client
// certificate, another node's, a malformed role URI.
func checkIdentity(name string, cert *x509.Certificate, requireRoles bool) error {
	id, err := identity.Of(cert)
	if err != nil {
		return fmt.Errorf("%w: its certificate's questrt:// URI SAN is malformed", ErrRefusedMember)
	}
	switch id.Role {
	case identity.Node:
		if id.Name != name {
			return fmt.Errorf("%w: its certificate is node %q's, not %q's (questrt://node/%s)", ErrRefusedMember, id.Name, name, name)
		}
		return nil
	case identity.Client:
		return fmt.Errorf("%w: it presents a client certificate (questrt://client/%s), not a node certificate", ErrRefusedMember, id.Name)
	}
	if requireRoles {
		return fmt.Errorf("%w: its certificate carries no questrt:// role and this node requires one (--require-cert-roles)", ErrRefusedMember)
	}
	return nil
}

// refusals returns the reason of every member of view whose current
// instance and address stand refused (the text after "member refused: ").
func (v *vetter) refusals(view cluster.View) map[string]string {
	out := map[string]string{}
	v.mu.Lock()
	defer v.mu.Unlock()
	for _, m := range view.Members {
		d := v.get[m.Name]
		if d == nil || d.instance != m.Instance || d.addr != m.Meta.GRPCAddr {
			continue
		}
		err := d.prev
		select {
		case <-d.done:
			err = d.err
		default:
		}
		if err != nil {
			out[m.Name] = strings.TrimPrefix(err.Error(), ErrRefusedMember.Error()+": ")
		}
	}
	return out
}

// forget drops the verdicts of names no longer in view.
func (v *vetter) forget(view cluster.View) {
	v.mu.Lock()
	defer v.mu.Unlock()
	for name := range v.get {
		if _, ok := view.Member(name); !ok {
			delete(v.get, name)
		}
	}
}

// watch checks every member of the view that is up and serves gRPC,
// after every change of the view and every retry interval, until ctx
// ends, so that Status shows the refused ones before any placement asks.
func (v *vetter) watch(ctx context.Context, view func() cluster.View, sub *cluster.Subscription) {
	defer sub.Close()
	t := time.NewTicker(v.retry)
	defer t.Stop()
	for {
		cur := view()
		v.forget(cur)
		for _, m := range cur.Members {
			if m.State.Up() && m.MetaErr == nil && m.Meta.GRPCAddr != "" {
				if v.vet(ctx, m) != nil && ctx.Err() != nil {
					return
				}
			}
		}
		select {
		case <-ctx.Done():
			return
		case _, ok := <-sub.Events():
			if !ok {
				return
			}
			// One pass covers every change queued meanwhile.
			for drained := false; !drained; {
				select {
				case _, ok := <-sub.Events():
					if !ok {
						return
					}
				default:
					drained = true
				}
			}
		case <-t.C:
		}
	}
}
