package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	iofs "io/fs"
	"path/filepath"
	"strings"
	"time"

	"github.com/questrt/questrt/internal/certgen"
	"github.com/questrt/questrt/internal/identity"
)

// tlsMaxDays bounds --days: ten years.
const tlsMaxDays = 3650

const tlsUsage = `Usage: questctl tls ca     --dir DIR [--days 365] [--name "questrt CA"] [--force]
       questctl tls node   NAME --dir DIR [--host H,...] [--out DIR] [--file BASE] [--days 365] [--force]
       questctl tls client NAME --dir DIR [--out DIR] [--file BASE] [--days 365] [--force]

Makes the certificates of a questrt cluster with mutual TLS, in place of
hand-run openssl: a CA, then one node certificate per questd (its role
the URI SAN questrt://node/NAME, NAME the node's --name) and client
certificates (questrt://client/NAME: the client API only). Keys are
ECDSA P-256 (PKCS #8), written mode 0600; certificates 0644. An existing
file is never replaced without --force.

Run 'questctl tls ca|node|client --help' for the flags of each.
`

// runTLS is 'questctl tls ca|node|client'.
func runTLS(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return usageError{errors.New("want ca, node or client (see 'questctl tls --help')")}
	}
	switch args[0] {
	case "ca":
		return runCommand(context.Background(), tlsCACommand, args[1:], stdout, stderr)
	case "node", "client":
		name, rest := tlsName(args[1:])
		return runCommand(context.Background(), tlsLeafCommand(args[0], name), rest, stdout, stderr)
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, tlsUsage)
		return nil
	}
	return usageError{fmt.Errorf("unknown subcommand %q (want ca, node or client)", args[0])}
}

// tlsName takes NAME out of args: the first argument that is neither a
// flag nor a flag's value (the value flags of 'tls node' and 'tls
// client' are --dir, --out, --file, --host and --days).
func tlsName(args []string) (name string, rest []string) {
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--":
			return name, append(rest, args[i+1:]...)
		case strings.HasPrefix(a, "-"):
			rest = append(rest, a)
			switch strings.TrimLeft(a, "-") {
			case "dir", "out", "file", "host", "days":
				if i+1 < len(args) {
					i++
					rest = append(rest, args[i])
				}
			}
		case name == "":
			name = a
		default:
			rest = append(rest, a) // a second name: parse refuses it
		}
	}
	return name, rest
}

// tlsCACommand builds the flags and the action of 'questctl tls ca'.
func tlsCACommand() (*flag.FlagSet, action) {
	fs := newFlags("tls ca", `Usage: questctl tls ca --dir DIR [--days 365] [--name "questrt CA"] [--force]

Makes a certificate authority for a questrt cluster: DIR/ca.pem (the
certificate, mode 0644: every node's and client's --tls-ca) and
DIR/ca.key (its private key, mode 0600: whoever holds it can make node
certificates, so keep it where you run 'questctl tls', not on the
nodes). DIR is created (mode 0700) if needed. The CA signs leaves only
(path length 0); its key is ECDSA P-256. Then make each node's
certificate with 'questctl tls node NAME --dir DIR' and clients' with
'questctl tls client NAME --dir DIR'.

Refuses (exit 2, nothing written) if DIR/ca.pem or DIR/ca.key exists,
unless --force: a new CA invalidates every certificate of the old one.`)
	dir := fs.String("dir", "", "directory to write ca.pem and ca.key in (required)")
	days := fs.Int("days", 365, fmt.Sprintf("days the CA is valid, 1 to %d", tlsMaxDays))
	name := fs.String("name", "questrt CA", "the CA certificate's subject common name")
	force := fs.Bool("force", false, "replace an existing ca.pem and ca.key")
	return fs, func(_ context.Context, stdout, _ io.Writer) error {
		if *dir == "" {
			return usageError{errors.New("--dir is required: where to write ca.pem and ca.key (see 'questctl tls ca --help')")}
		}
		if err := checkDays(*days); err != nil {
			return err
		}
		ca, err := certgen.NewCAFor(*name, time.Duration(*days)*24*time.Hour)
		if err != nil {
			return err
		}
		if err := certgen.WriteCA(*dir, ca, *force); err != nil {
			return tlsWriteError(err)
		}
		fmt.Fprintf(stdout, "wrote %s (CA certificate) and %s (CA key, 0600: keep it off the nodes), valid until %s\n",
			filepath.Join(*dir, certgen.CAFile), filepath.Join(*dir, certgen.CAKeyFile), ca.Cert.NotAfter.UTC().Format(time.RFC3339))
		return nil
	}
}

// tlsLeafCommand returns the builder of 'questctl tls node NAME' or
// 'questctl tls client NAME' (role "node" or "client").
func tlsLeafCommand(role, name string) func() (*flag.FlagSet, action) {
	return func() (*flag.FlagSet, action) {
		var fs *flag.FlagSet
		var hosts *string
		if role == "node" {
			fs = newFlags("tls node", `Usage: questctl tls node NAME --dir DIR [--host H,...] [--out DIR] [--file BASE] [--days 365] [--force]

Makes the certificate of questd node NAME (its --name), signed by the CA
in DIR (DIR/ca.pem and DIR/ca.key, from 'questctl tls ca'): OUT/NAME.pem
(mode 0644, questd's --tls-cert) and OUT/NAME.key (0600, --tls-key). It
carries the URI SAN questrt://node/NAME, which lets it call the worker
API and the collective streams, and under which the other nodes place
ranks on it (a node presenting another name's certificate is refused);
its DNS and IP SANs are the --host list, which must hold every name and
address clients and peers dial it at. It is for server and client
authentication (mutual TLS). --file BASE writes OUT/BASE.pem and
OUT/BASE.key instead, for a fixed path that does not depend on NAME (a
Kubernetes init container writing each pod's certificate where one
config for every pod points).

NAME is 1 to 253 printable ASCII characters without space, '/', '\' or
'%', not starting with '.', and not "ca". Refuses (exit 2, nothing
written) if OUT/NAME.pem or OUT/NAME.key exists, unless --force.`)
			hosts = fs.String("host", "localhost,127.0.0.1,::1", "comma-separated DNS names and IP addresses the certificate names (its SANs): the addresses clients and peers dial")
		} else {
			fs = newFlags("tls client", `Usage: questctl tls client NAME --dir DIR [--out DIR] [--file BASE] [--days 365] [--force]

Makes a client certificate, signed by the CA in DIR (DIR/ca.pem and
DIR/ca.key, from 'questctl tls ca'): OUT/NAME.pem (mode 0644) and
OUT/NAME.key (0600). It carries the URI SAN questrt://client/NAME, which
lets it call the client API only (status, replay, generate), never the
worker API. With NAME "client" the files are those 'questctl status
--tls-dir OUT' reads (ca.pem, client.pem, client.key); else pass --ca
DIR/ca.pem --tls-cert OUT/NAME.pem --tls-key OUT/NAME.key.

NAME is 1 to 253 printable ASCII characters without space, '/', '\' or
'%', not starting with '.', and not "ca". Refuses (exit 2, nothing
written) if OUT/NAME.pem or OUT/NAME.key exists, unless --force.`)
		}
		dir := fs.String("dir", "", "directory of the CA (ca.pem and ca.key from 'questctl tls ca'; required)")
		out := fs.String("out", "", "directory to write NAME.pem and NAME.key in (default: --dir)")
		file := fs.String("file", "", "base name of the files to write, BASE.pem and BASE.key, instead of NAME (same rules as NAME)")
		days := fs.Int("days", 365, fmt.Sprintf("days the certificate is valid, 1 to %d (never after the CA)", tlsMaxDays))
		force := fs.Bool("force", false, "replace an existing NAME.pem and NAME.key")
		return fs, func(_ context.Context, stdout, _ io.Writer) error {
			r := identity.Node
			if role == "client" {
				r = identity.Client
			}
			if name == "" {
				return usageError{fmt.Errorf("want the %s's NAME (see 'questctl tls %s --help')", role, role)}
			}
			if _, err := identity.URI(r, name); err != nil || name == "ca" || strings.HasPrefix(name, ".") || strings.Contains(name, `\`) {
				return usageError{fmt.Errorf("NAME %q: want 1 to 253 printable ASCII characters without space, '/', '\\' or '%%', not starting with '.', and not \"ca\"", name)}
			}
			base := name
			if *file != "" {
				base = *file
				if _, err := identity.URI(r, base); err != nil || base == "ca" || strings.HasPrefix(base, ".") || strings.Contains(base, `\`) {
					return usageError{fmt.Errorf("--file %q: want 1 to 253 printable ASCII characters without space, '/', '\\' or '%%', not starting with '.', and not \"ca\"", base)}
				}
			}
			if *dir == "" {
				return usageError{fmt.Errorf("--dir is required: the directory of ca.pem and ca.key (see 'questctl tls %s --help')", role)}
			}
			if err := checkDays(*days); err != nil {
				return err
			}
			var sans []string
			if hosts != nil {
				for _, h := range strings.Split(*hosts, ",") {
					if h = strings.TrimSpace(h); h != "" {
						sans = append(sans, h)
					}
				}
				if len(sans) == 0 {
					return usageError{errors.New("--host: no host names or addresses")}
				}
			}
			ca, err := certgen.LoadCA(*dir)
			if err != nil {
				if errors.Is(err, certgen.ErrBadCA) || errors.Is(err, iofs.ErrNotExist) {
					return usageError{fmt.Errorf("--dir %q: %v (make one with 'questctl tls ca --dir DIR')", *dir, err)}
				}
				return err
			}
			ca.LeafValidity = time.Duration(*days) * 24 * time.Hour
			leaf, err := ca.IssueRole(r, name, sans...)
			if err != nil {
				return usageError{fmt.Errorf("--host: %v", err)}
			}
			dst := *out
			if dst == "" {
				dst = *dir
			}
			if err := certgen.WriteLeaf(dst, base, leaf, *force); err != nil {
				return tlsWriteError(err)
			}
			fmt.Fprintf(stdout, "wrote %s and %s (key, 0600): %s certificate questrt://%s/%s, valid until %s\n",
				filepath.Join(dst, certgen.CertFile(base)), filepath.Join(dst, certgen.KeyFile(base)), role, role, name,
				leaf.Cert.NotAfter.UTC().Format(time.RFC3339))
			return nil
		}
	}
}

// checkDays checks --days.
func checkDays(days int) error {
	if days < 1 || days > tlsMaxDays {
		return usageError{fmt.Errorf("--days %d: want 1 to %d", days, tlsMaxDays)}
	}
	return nil
}

// tlsWriteError makes a refusal to overwrite a usage error.
func tlsWriteError(err error) error {
	if errors.Is(err, certgen.ErrExists) {
		return usageError{err}
	}
	return err
}
