// Package identity reads and writes the role a questrt certificate
// carries: a URI subject alternative name questrt://ROLE/NAME, ROLE
// being "node" (a questd of the cluster) or "client" (a caller of the
// client API), NAME the node's or client's name. internal/certgen issues
// certificates with it; node authorizes every gRPC call by it.
package identity

import (
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"strings"
)

// Scheme is the URI scheme of a role SAN.
const Scheme = "questrt"

// Role is what a certificate's holder may do.
type Role uint8

const (
	// None: the certificate has no questrt:// URI SAN (one issued by a
	// questrt before roles, or by hand with openssl).
	None Role = iota
	// Node: a questd of the cluster (the worker API, the collective
	// streams and the client API, for forwarding).
	Node
	// Client: a caller of the client API only.
	Client
)

// String is the role's name in a URI ("node", "client"), or "none".
func (r Role) String() string {
	switch r {
	case Node:
		return "node"
	case Client:
		return "client"
	}
	return "none"
}

// ErrMalformed: a questrt:// URI SAN that is not questrt://node/NAME or
// questrt://client/NAME, or a certificate whose role SANs disagree.
var ErrMalformed = errors.New("identity: malformed questrt role URI")

// maxName bounds the length of a NAME.
const maxName = 253

// Identity is a certificate's role and name.
type Identity struct {
	Role Role
	Name string
}

// URI is the role SAN of role and name: questrt://ROLE/NAME. name must
// be 1 to 253 bytes of printable ASCII without '/' (a node or client
// name); role Node or Client.
func URI(role Role, name string) (*url.URL, error) {
	if role != Node && role != Client {
		return nil, fmt.Errorf("%w: role %d", ErrMalformed, role)
	}
	if err := checkName(name); err != nil {
		return nil, err
	}
	return &url.URL{Scheme: Scheme, Host: role.String(), Path: "/" + name}, nil
}

// checkName reports whether name can be the NAME of a role URI.
func checkName(name string) error {
	if name == "" || len(name) > maxName {
		return fmt.Errorf("%w: name of %d bytes, want 1 to %d", ErrMalformed, len(name), maxName)
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; c <= ' ' || c >= 0x7f || c == '/' || c == '%' {
			return fmt.Errorf("%w: name %q: want printable ASCII without space, '/' or '%%'", ErrMalformed, name)
		}
	}
	return nil
}

// Parse reads a role URI: questrt://node/NAME or questrt://client/NAME,
// without user, port, query or fragment. A URI of another scheme is not
// a role URI: ok is false and err nil.
func Parse(u *url.URL) (id Identity, ok bool, err error) {
	if u == nil || !strings.EqualFold(u.Scheme, Scheme) {
		return Identity{}, false, nil
	}
	bad := func(why string) (Identity, bool, error) {
		return Identity{}, true, fmt.Errorf("%w: %q: %s", ErrMalformed, u.String(), why)
	}
	if u.Opaque != "" || u.User != nil || u.RawQuery != "" || u.ForceQuery || u.Fragment != "" || u.Port() != "" {
		return bad("want questrt://node/NAME or questrt://client/NAME and nothing else")
	}
	switch strings.ToLower(u.Host) {
	case "node":
		id.Role = Node
	case "client":
		id.Role = Client
	default:
		return bad("the role is neither node nor client")
	}
	name, found := strings.CutPrefix(u.Path, "/")
	if !found {
		return bad("no name")
	}
	if err := checkName(name); err != nil {
		return bad(err.Error())
	}
	id.Name = name
	return id, true, nil
}

// ParseString is Parse of a URI's text.
func ParseString(s string) (Identity, bool, error) {
	u, err := url.Parse(s)
	if err != nil {
		if strings.HasPrefix(strings.ToLower(s), Scheme+":") {
			return Identity{}, true, fmt.Errorf("%w: %v", ErrMalformed, err)
		}
		return Identity{}, false, nil
	}
	return Parse(u)
}

// Of is the identity a certificate carries in its URI SANs: the role
// and name of its questrt:// URIs, which must all parse and agree
// (ErrMalformed otherwise), or Role None when it has none. URIs of other
// schemes are ignored.
func Of(cert *x509.Certificate) (Identity, error) {
	var id Identity
	for _, u := range cert.URIs {
		got, ok, err := Parse(u)
		if !ok {
			continue
		}
		if err != nil {
			return Identity{}, err
		}
		if id.Role != None && got != id {
			return Identity{}, fmt.Errorf("%w: the certificate names two identities, %s %q and %s %q", ErrMalformed, id.Role, id.Name, got.Role, got.Name)
		}
		id = got
	}
	return id, nil
}
