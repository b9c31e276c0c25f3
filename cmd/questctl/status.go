package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	decodev1 "github.com/questrt/questrt/api/decode/v1"
	workerv1 "github.com/questrt/questrt/api/worker/v1"
	"github.com/questrt/questrt/client"
	"github.com/questrt/questrt/internal/certgen"
	"github.com/questrt/questrt/internal/readlimit"
)

func runStatus(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return runCommand(ctx, statusCommand, args, stdout, stderr)
}

// statusCommand builds the flags and the action of
// 'questctl status' without running it (see [runCommand]).
func statusCommand() (*flag.FlagSet, action) {
	fs := newFlags("status", `Usage: questctl status --addr HOST:PORT [--json] [--timeout 5s] [--tls-dir DIR | --ca FILE --tls-cert FILE --tls-key FILE] [--token-file FILE]

Asks one questd (Decode/Status) for its view of the cluster and prints it:
the node, its version and membership view, a table of the members (name,
state alive|suspect|dead|left, gRPC address, free/total pages, version),
the members the node refuses to place on and why (a member whose gRPC
certificate is not the node certificate of its name, or that cannot be
reached under the cluster's TLS: "refused: NAME: REASON"), the node's devices, the grid configuration (geometry, cp x tp, capacity,
selection mode, policy), how many sequences and grids it holds, and the
sequences its coordinator adopted after a restart on --data-dir (their
length and the tail tokens lost, to append again) or found damaged.

With --json it prints the StatusReply as one line of protojson (proto
field names, unset fields included). A node that does not answer within
--timeout is a one-line error (exit 1).

Plaintext unless a TLS flag is given: --tls-dir DIR takes the CA and the
client certificate that 'questctl up' wrote in DIR (it prints the
command); --ca, --tls-cert and --tls-key name the files one by one (a
questd with mutual TLS wants a client certificate of its CA);
--plaintext=false alone is TLS verified against the system roots. A
questd started with --token-file wants its token: pass the same file
with --token-file (over plaintext only to a loopback address; over TLS
to any).`)
	addr := fs.String("addr", "", "gRPC address of the questd to ask, HOST:PORT (required)")
	asJSON := fs.Bool("json", false, "print the StatusReply as one line of protojson")
	timeout := fs.Duration("timeout", 5*time.Second, "give up when the node has not answered within this time")
	conn := addConnFlags(fs)
	tokenFile := tokenFileFlag(fs)
	return fs, func(ctx context.Context, stdout, stderr io.Writer) error {
		switch {
		case !flagSet(fs, "addr"):
			return usageError{errors.New("--addr is required: the HOST:PORT of a questd's gRPC server (see 'questctl status --help')")}
		case *timeout <= 0:
			return usageError{fmt.Errorf("--timeout %q: must be positive", timeout.String())}
		}
		if err := checkHostPort(*addr); err != nil {
			return usageError{fmt.Errorf("--addr %q: %v", *addr, err)}
		}
		sec, err := conn.settings()
		if err != nil {
			return err
		}
		token, err := readTokenFile(*tokenFile)
		if err != nil {
			return err
		}
		cc, err := dialDecode(*addr, sec, token)
		if err != nil {
			return err
		}
		defer cc.Close()
		cctx, cancel := context.WithTimeout(ctx, *timeout)
		defer cancel()
		reply, err := decodev1.NewDecodeClient(cc).Status(cctx, &decodev1.StatusRequest{})
		if err != nil {
			return statusCallError(*addr, *timeout, sec, err)
		}
		if *asJSON {
			b, err := protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true}.Marshal(reply)
			if err != nil {
				return err
			}
			_, err = fmt.Fprintf(stdout, "%s\n", b)
			return err
		}
		return writeStatus(stdout, reply)
	}
}

// checkHostPort reports whether addr is HOST:PORT with a numeric port.
func checkHostPort(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil || host == "" || port == "" {
		return errors.New("want HOST:PORT")
	}
	if _, err := net.LookupPort("tcp", port); err != nil {
		return fmt.Errorf("bad port %q", port)
	}
	return nil
}

// tokenFileFlag defines --token-file on fs.
func tokenFileFlag(fs *flag.FlagSet) *string {
	return fs.String("token-file", "", "file holding the bearer token of questd's --token-file, sent with every call (over plaintext only to a loopback address; over TLS to any)")
}

// maxTokenFile bounds a --token-file (a token is a line).
const maxTokenFile = 64 << 10

// readTokenFile reads the token of --token-file path (whitespace
// trimmed); "" for no path. An empty or unreadable file is a usage error.
func readTokenFile(path string) (string, error) {
	if path == "" {
		return "", nil
	}
	b, err := readlimit.ReadFile(path, maxTokenFile)
	if err != nil {
		return "", usageError{fmt.Errorf("--token-file %q: %v", path, errors.Unwrap(err))}
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", usageError{fmt.Errorf("--token-file %q: empty", path)}
	}
	return tok, nil
}

// connFlags are the flags that say how questctl reaches a questd's gRPC
// server (status, replay --addr, generate --addr, through [dialDecode]
// and [connFlags.dial]): plaintext, or TLS with a CA and a client
// certificate for mutual TLS, one by one or as the files that
// 'questctl up' wrote in a directory.
type connFlags struct {
	fs                 *flag.FlagSet
	plaintext          *bool
	ca, cert, key, dir *string
}

// addConnFlags defines --plaintext, --ca, --tls-cert, --tls-key and
// --tls-dir on fs.
func addConnFlags(fs *flag.FlagSet) *connFlags {
	plaintext := fs.Bool("plaintext", true, "talk to questd without TLS, unless --tls-dir, --ca or --tls-cert is given (--plaintext=false alone: TLS verified against the system roots, no client certificate)")
	fs.BoolVar(plaintext, "insecure", true, "the same as --plaintext (the name questd and questctl up use)")
	return &connFlags{
		fs:        fs,
		plaintext: plaintext,
		ca:        fs.String("ca", "", "PEM file of the CA that signed questd's certificate (TLS; default with TLS: the system roots)"),
		cert:      fs.String("tls-cert", "", "PEM file of the client certificate, with --tls-key, for a questd with mutual TLS (TLS)"),
		key:       fs.String("tls-key", "", "PEM file of the key of --tls-cert"),
		dir:       fs.String("tls-dir", "", "TLS with the files 'questctl up' wrote in DIR: --ca DIR/"+certgen.CAFile+" --tls-cert DIR/"+certgen.CertFile(upClientName)+" --tls-key DIR/"+certgen.KeyFile(upClientName)),
	}
}

// connSecurity is how a connection to a questd is secured: plaintext, or
// TLS verified against the PEM file ca (empty: the system roots), with
// the client certificate cert and key (empty: none).
type connSecurity struct {
	plaintext     bool
	ca, cert, key string
	dir           string // the --tls-dir that named the files, if one did
}

// settings checks the flags (after parse) and returns the security they
// ask for; bad combinations are usage errors. The files are read by
// dialDecode and dial.
func (f *connFlags) settings() (connSecurity, error) {
	s := connSecurity{ca: *f.ca, cert: *f.cert, key: *f.key}
	if *f.dir != "" {
		for _, name := range []string{"ca", "tls-cert", "tls-key"} {
			if flagSet(f.fs, name) {
				return s, usageError{fmt.Errorf("--tls-dir %q: not with --%s (it names DIR/%s, DIR/%s and DIR/%s)",
					*f.dir, name, certgen.CAFile, certgen.CertFile(upClientName), certgen.KeyFile(upClientName))}
			}
		}
		s.dir = *f.dir
		s.ca = filepath.Join(s.dir, certgen.CAFile)
		s.cert = filepath.Join(s.dir, certgen.CertFile(upClientName))
		s.key = filepath.Join(s.dir, certgen.KeyFile(upClientName))
	}
	if (s.cert == "") != (s.key == "") {
		return s, usageError{errors.New("--tls-cert and --tls-key: give both (the client certificate and its key) or neither")}
	}
	var tlsFlag string
	for _, name := range []string{"tls-dir", "ca", "tls-cert"} {
		if flagSet(f.fs, name) && tlsFlag == "" {
			tlsFlag = name
		}
	}
	for _, name := range []string{"plaintext", "insecure"} {
		if tlsFlag != "" && flagSet(f.fs, name) && *f.plaintext {
			return s, usageError{fmt.Errorf("--%s: conflicts with --%s, which asks for TLS", name, tlsFlag)}
		}
	}
	s.plaintext = *f.plaintext && tlsFlag == ""
	return s, nil
}

// file names a file of s for an error message: the flag that named it.
func (s connSecurity) file(flag, path string) string {
	if s.dir != "" {
		return fmt.Sprintf("--tls-dir %q: %s", s.dir, path)
	}
	return fmt.Sprintf("--%s %q", flag, path)
}

// credentials reads the files of s and returns the transport credentials
// and, when token is set, the per-call credentials that send it (over
// plaintext only to a loopback addr). Unreadable files and a token that
// would travel in the clear are usage errors. Every command's connection
// to a questd is made from these.
func (s connSecurity) credentials(addr, token string) (credentials.TransportCredentials, credentials.PerRPCCredentials, error) {
	creds := insecure.NewCredentials()
	if !s.plaintext {
		cfg := &tls.Config{MinVersion: tls.VersionTLS12}
		if s.ca != "" {
			b, err := readlimit.ReadFile(s.ca, readlimit.MaxPEMFile)
			if err != nil {
				return nil, nil, usageError{fmt.Errorf("%s: %v", s.file("ca", s.ca), errors.Unwrap(err))}
			}
			cfg.RootCAs = x509.NewCertPool()
			if !cfg.RootCAs.AppendCertsFromPEM(b) {
				return nil, nil, usageError{fmt.Errorf("%s: no PEM certificate in it", s.file("ca", s.ca))}
			}
		}
		if s.cert != "" {
			c, err := readlimit.LoadX509KeyPair(s.cert, s.key)
			if err != nil {
				what := fmt.Sprintf("--tls-cert %q, --tls-key %q", s.cert, s.key)
				if s.dir != "" {
					what = fmt.Sprintf("--tls-dir %q", s.dir)
				}
				return nil, nil, usageError{fmt.Errorf("%s: %v", what, err)}
			}
			cfg.Certificates = []tls.Certificate{c}
		}
		creds = credentials.NewTLS(cfg)
	}
	if token == "" {
		return creds, nil, nil
	}
	tc, err := client.TokenCredentials(addr, token, creds)
	if err != nil {
		return nil, nil, usageError{fmt.Errorf("--token-file: %v", err)}
	}
	return creds, tc, nil
}

// dialDecode makes a client connection to a questd's gRPC server, secured
// as s says, with a bearer token on every call (none when ""). The
// connection is lazy: nothing is dialled until the first call.
func dialDecode(addr string, s connSecurity, token string) (*grpc.ClientConn, error) {
	creds, tc, err := s.credentials(addr, token)
	if err != nil {
		return nil, err
	}
	opts := []grpc.DialOption{grpc.WithTransportCredentials(creds)}
	if tc != nil {
		opts = append(opts, grpc.WithPerRPCCredentials(tc))
	}
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		return nil, usageError{fmt.Errorf("--addr %q: %v", addr, err)}
	}
	return conn, nil
}

// connectTimeout bounds how long a command waits for a questd to answer
// its first call (dial; the HTTP commands' connect).
const connectTimeout = 10 * time.Second

// dial connects a cluster client (client.Dial, within ctx and at most
// connectTimeout) to the questd at addr as the flags say, with the bearer
// token (none when "").
func (f *connFlags) dial(ctx context.Context, addr, token string) (*client.Client, error) {
	s, err := f.settings()
	if err != nil {
		return nil, err
	}
	creds, _, err := s.credentials(addr, token) // client.Dial makes the token's credentials itself
	if err != nil {
		return nil, err
	}
	// A node that is not up, or whose TLS does not match the flags,
	// shows up as a wait: bound it by connectTimeout, not the command's
	// whole deadline.
	dctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	c, err := client.Dial(dctx, addr, client.Options{Creds: creds, Token: token})
	if err != nil && (errors.Is(err, context.DeadlineExceeded) || grpcstatus.Code(err) == codes.DeadlineExceeded) {
		// client.Dial waits for the connection; a quick call says why
		// it never became ready (a TLS mismatch, refused).
		if why := probe(addr, s, token); why != nil {
			return nil, why
		}
	}
	return c, err
}

// probe makes one fail-fast Status call to addr and returns its error as
// statusCallError words it, or nil when the call succeeds.
func probe(addr string, s connSecurity, token string) error {
	cc, err := dialDecode(addr, s, token)
	if err != nil {
		return err
	}
	defer cc.Close()
	const wait = 3 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	if _, err := decodev1.NewDecodeClient(cc).Status(ctx, &decodev1.StatusRequest{}); err != nil {
		return statusCallError(addr, wait, s, err)
	}
	return nil
}

// statusCallError turns a failed Status call over a connection secured
// as s into one line naming the node, and what to try when the failure
// looks like the client's and the node's TLS disagreeing.
func statusCallError(addr string, timeout time.Duration, s connSecurity, err error) error {
	st := grpcstatus.Convert(err)
	switch st.Code() {
	case codes.DeadlineExceeded:
		return fmt.Errorf("questd at %s did not answer within %v", addr, timeout)
	case codes.Canceled:
		return fmt.Errorf("questd at %s: interrupted", addr)
	case codes.Unavailable:
		msg := st.Message()
		// "connection error: desc = \"transport: Error while dialing: dial tcp ...: connection refused\""
		if _, dial, ok := strings.Cut(msg, "Error while dialing: "); ok {
			return fmt.Errorf("cannot reach questd at %s: %s", addr, strings.TrimSuffix(dial, `"`))
		}
		return fmt.Errorf("cannot reach questd at %s: %s%s", addr, msg, tlsHint(s, msg))
	}
	return fmt.Errorf("questd at %s: %s: %s", addr, st.Code(), st.Message())
}

// tlsHint is what to try when a connection, secured as s, failed with
// msg after the dial (the handshake, the first frames).
func tlsHint(s connSecurity, msg string) string {
	switch {
	case s.plaintext:
		return "; plaintext was refused: if the node uses TLS (questctl up does unless --insecure), pass --tls-dir DIR as 'questctl up' printed it, or --ca, --tls-cert and --tls-key"
	case strings.Contains(msg, "first record does not look like a TLS handshake"):
		return "; the node does not speak TLS: drop the TLS flags (a node started with --insecure)"
	case strings.Contains(msg, "unknown authority") || strings.Contains(msg, "unknown certificate authority"):
		return "; the node and this client trust different CAs: check --ca and --tls-cert (or --tls-dir)"
	case s.cert == "":
		// Under TLS 1.3 a refused client shows as a failed write or
		// read after the handshake ("broken pipe", "certificate
		// required").
		return "; no client certificate was sent: a questd with mutual TLS wants one, pass --tls-cert and --tls-key, or --tls-dir"
	}
	return ""
}

// writeStatus prints a StatusReply for people.
func writeStatus(w io.Writer, r *decodev1.StatusReply) error {
	var b strings.Builder
	fmt.Fprintf(&b, "node %s  version %s  view %d\n", orDash(r.GetNode()), orDash(r.GetVersion()), r.GetView())

	members := append([]*decodev1.Member(nil), r.GetMembers()...)
	sort.SliceStable(members, func(i, j int) bool { return members[i].GetName() < members[j].GetName() })
	counts := map[string]int{}
	for _, m := range members {
		counts[m.GetState()]++
	}
	var states []string
	for _, s := range []string{"alive", "suspect", "dead", "left"} {
		if counts[s] > 0 {
			states = append(states, fmt.Sprintf("%d %s", counts[s], s))
			delete(counts, s)
		}
	}
	for s, n := range counts { // states this questctl does not know
		states = append(states, fmt.Sprintf("%d %s", n, orDash(s)))
	}
	fmt.Fprintf(&b, "members: %d", len(members))
	if len(states) > 0 {
		fmt.Fprintf(&b, " (%s)", strings.Join(states, ", "))
	}
	b.WriteString("\n")
	if len(members) > 0 {
		tw := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  NAME\tSTATE\tGRPC\tFREE/TOTAL PAGES\tVERSION")
		for _, m := range members {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%d/%d\t%s\n", orDash(m.GetName()), orDash(m.GetState()), orDash(m.GetGrpcAddr()),
				m.GetFreePages(), m.GetTotalPages(), orDash(m.GetVersion()))
		}
		tw.Flush()
	}
	for _, m := range members {
		if why := m.GetRefused(); why != "" {
			fmt.Fprintf(&b, "refused: %s: %s (never placed on)\n", orDash(m.GetName()), oneLine(why))
		}
	}

	if len(r.GetDevices()) == 0 {
		b.WriteString("devices: none\n")
	} else {
		fmt.Fprintf(&b, "devices: %d\n", len(r.GetDevices()))
		for _, d := range r.GetDevices() {
			fmt.Fprintf(&b, "  %s  %s", orDash(d.GetKind()), orDash(d.GetName()))
			if d.GetMemoryBytes() > 0 {
				fmt.Fprintf(&b, "  %.1f GiB", float64(d.GetMemoryBytes())/(1<<30))
			}
			b.WriteString("\n")
		}
	}

	writeGrid(&b, r.GetConfig())
	fmt.Fprintf(&b, "sequences %d, grids %d\n", r.GetSequences(), r.GetGrids())
	for _, q := range r.GetRecovered() {
		fmt.Fprintf(&b, "recovered %s: length %d, lost %d tokens (append them again from %d)", q.GetSequence(), q.GetLength(), q.GetLostTokens(), slices.Max(append([]uint64{q.GetLength()}, q.GetLens()...)))
		if lost := q.GetLost(); len(lost) > 0 && slices.Min(lost) != slices.Max(lost) {
			fmt.Fprintf(&b, ", per layer %v", lost)
		}
		if rb := q.GetRolledBack(); len(rb) > 0 {
			fmt.Fprintf(&b, ", of them rolled back per layer %v (an interrupted step, never acknowledged)", rb)
		}
		if q.GetRenamedFrom() != "" {
			fmt.Fprintf(&b, ", was %s", q.GetRenamedFrom())
		}
		b.WriteString("\n")
	}
	for _, d := range r.GetDamaged() {
		why := d.GetReason() // what a node said, shorter than the error
		if why == "" {
			why = d.GetError()
		}
		fmt.Fprintf(&b, "damaged %s: %s", orDash(d.GetSequence()), oneLine(why))
		if d.GetParked() {
			b.WriteString(" (parked: recovered at the nodes' next restart)")
		}
		b.WriteString("\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// writeGrid prints the grid configuration and its policy.
func writeGrid(b *strings.Builder, c *workerv1.GridConfig) {
	if c == nil {
		b.WriteString("grid: not configured\n")
		return
	}
	fmt.Fprintf(b, "grid: cp %d x tp %d, layers %d, q-heads %d, kv-heads %d, head-dim %d, page-size %d, capacity %d pages per rank, selection %s\n",
		c.GetCp(), c.GetTp(), c.GetLayers(), c.GetQHeads(), c.GetKvHeads(), c.GetHeadDim(), c.GetPageSize(), c.GetCapacityPages(), orDash(c.GetMode()))
	if p := c.GetPolicy(); p != nil {
		fmt.Fprintf(b, "policy: selector %s, gqa %s, budget %d tokens, sink %d pages, local %d pages, dense layers %d",
			orDash(p.GetSelector()), orDash(p.GetGqa()), p.GetBudgetTokens(), p.GetSinkPages(), p.GetLocalPages(), p.GetDenseLayers())
		if lb := p.GetLayerBudget(); len(lb) > 0 {
			layers := make([]uint32, 0, len(lb))
			for l := range lb {
				layers = append(layers, l)
			}
			sort.Slice(layers, func(i, j int) bool { return layers[i] < layers[j] })
			parts := make([]string, len(layers))
			for i, l := range layers {
				parts[i] = fmt.Sprintf("%d:%d", l, lb[l])
			}
			fmt.Fprintf(b, ", layer budgets %s", strings.Join(parts, ","))
		}
		b.WriteString("\n")
	}
}

// orDash is s, or "-" when s is empty.
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// oneLine is s with its runs of white space (line breaks included) made
// one space: a node's text printed on one line of ours.
func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }
