package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
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
	"github.com/questrt/questrt/cluster/client"
)

func runStatus(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("status", `Usage: questctl status --addr HOST:PORT [--json] [--timeout 5s] [--plaintext=true] [--token-file FILE]

Asks one questd (Decode/Status) for its view of the cluster and prints it:
the node, its version and membership view, a table of the members (name,
state alive|suspect|dead|left, gRPC address, free/total pages, version),
the node's devices, the grid configuration (geometry, cp x tp, capacity,
selection mode, policy) and how many sequences and grids it holds.

With --json it prints the StatusReply as one line of protojson (proto
field names, unset fields included). A node that does not answer within
--timeout is a one-line error (exit 1). A questd started with
--token-file wants its token: pass the same file with --token-file
(over plaintext only to a loopback address).`)
	addr := fs.String("addr", "", "gRPC address of the questd to ask, HOST:PORT (required)")
	asJSON := fs.Bool("json", false, "print the StatusReply as one line of protojson")
	timeout := fs.Duration("timeout", 5*time.Second, "give up when the node has not answered within this time")
	plaintext := fs.Bool("plaintext", true, "talk to questd without TLS (--plaintext=false: TLS, verified against --ca or the system roots)")
	ca := fs.String("ca", "", "PEM file of the CA that signed questd's certificate (with --plaintext=false; default: the system roots)")
	tokenFile := tokenFileFlag(fs)
	if err := parse(fs, args, stdout); err != nil {
		return err
	}
	switch {
	case !flagSet(fs, "addr"):
		return usageError{errors.New("--addr is required: the HOST:PORT of a questd's gRPC server (see 'questctl status --help')")}
	case *timeout <= 0:
		return usageError{fmt.Errorf("--timeout %q: must be positive", timeout.String())}
	case *plaintext && *ca != "":
		return usageError{fmt.Errorf("--ca %q: only with --plaintext=false", *ca)}
	}
	if err := checkHostPort(*addr); err != nil {
		return usageError{fmt.Errorf("--addr %q: %v", *addr, err)}
	}
	token, err := readTokenFile(*tokenFile)
	if err != nil {
		return err
	}
	conn, err := dialDecodeToken(*addr, *plaintext, *ca, token)
	if err != nil {
		return err
	}
	defer conn.Close()
	cctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	reply, err := decodev1.NewDecodeClient(conn).Status(cctx, &decodev1.StatusRequest{})
	if err != nil {
		return statusCallError(*addr, *timeout, err)
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
	return fs.String("token-file", "", "file holding the bearer token of questd's --token-file, sent with every call (over plaintext only to a loopback address)")
}

// readTokenFile reads the token of --token-file path (whitespace
// trimmed); "" for no path. An empty or unreadable file is a usage error.
func readTokenFile(path string) (string, error) {
	if path == "" {
		return "", nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", usageError{fmt.Errorf("--token-file %q: %v", path, errors.Unwrap(err))}
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", usageError{fmt.Errorf("--token-file %q: empty", path)}
	}
	return tok, nil
}

// dialDecode makes a client connection to a questd's gRPC server: over
// plaintext, or TLS verified against the PEM file ca (empty: the system
// roots). The connection is lazy: nothing is dialled until the first call.
func dialDecode(addr string, plaintext bool, ca string) (*grpc.ClientConn, error) {
	return dialDecodeToken(addr, plaintext, ca, "")
}

// dialDecodeToken is dialDecode with a bearer token on every call (none
// when "").
func dialDecodeToken(addr string, plaintext bool, ca, token string) (*grpc.ClientConn, error) {
	creds := insecure.NewCredentials()
	if !plaintext {
		creds = credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS12})
		if ca != "" {
			c, err := credentials.NewClientTLSFromFile(ca, "")
			if err != nil {
				return nil, usageError{fmt.Errorf("--ca %q: %v", ca, err)}
			}
			creds = c
		}
	}
	opts := []grpc.DialOption{grpc.WithTransportCredentials(creds)}
	if token != "" {
		tc, err := client.TokenCredentials(addr, token, creds)
		if err != nil {
			return nil, usageError{fmt.Errorf("--token-file: %v", err)}
		}
		opts = append(opts, grpc.WithPerRPCCredentials(tc))
	}
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		return nil, usageError{fmt.Errorf("--addr %q: %v", addr, err)}
	}
	return conn, nil
}

// statusCallError turns a failed Status call into one line naming the node.
func statusCallError(addr string, timeout time.Duration, err error) error {
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
			msg = strings.TrimSuffix(dial, `"`)
		}
		return fmt.Errorf("cannot reach questd at %s: %s", addr, msg)
	}
	return fmt.Errorf("questd at %s: %s: %s", addr, st.Code(), st.Message())
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
