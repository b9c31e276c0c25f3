package identity

import (
	"crypto/x509"
	"errors"
	"net/url"
	"testing"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		uri  string
		want Identity
		ok   bool
		bad  bool
	}{
		{"questrt://node/n0", Identity{Node, "n0"}, true, false},
		{"questrt://client/client", Identity{Client, "client"}, true, false},
		{"QUESTRT://Node/a-1.b", Identity{Node, "a-1.b"}, true, false},
		{"spiffe://example.org/ns/x", Identity{}, false, false},
		{"https://node/n0", Identity{}, false, false},
		{"questrt://admin/x", Identity{}, true, true},
		{"questrt://node/", Identity{}, true, true},
		{"questrt://node", Identity{}, true, true},
		{"questrt://node/a/b", Identity{}, true, true},
		{"questrt://node:1/a", Identity{}, true, true},
		{"questrt://u@node/a", Identity{}, true, true},
		{"questrt://node/a?x", Identity{}, true, true},
		{"questrt://node/a#x", Identity{}, true, true},
		{"questrt://node/a%20b", Identity{}, true, true},
		{"questrt:node/a", Identity{}, true, true},
		{"questrt://node/%zz", Identity{}, true, true},
	} {
		got, ok, err := ParseString(tc.uri)
		if ok != tc.ok || (err != nil) != tc.bad || got != tc.want {
			t.Errorf("%q: %+v %v %v, want %+v ok %v bad %v", tc.uri, got, ok, err, tc.want, tc.ok, tc.bad)
		}
		if err != nil && !errors.Is(err, ErrMalformed) {
			t.Errorf("%q: %v is not ErrMalformed", tc.uri, err)
		}
	}
}

func TestOf(t *testing.T) {
	u := func(s string) *url.URL {
		v, err := url.Parse(s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	for _, tc := range []struct {
		name string
		uris []string
		want Role
		bad  bool
	}{
		{"none", nil, None, false},
		{"other schemes only", []string{"spiffe://x/y"}, None, false},
		{"node", []string{"spiffe://x/y", "questrt://node/n0"}, Node, false},
		{"client twice", []string{"questrt://client/c", "questrt://client/c"}, Client, false},
		{"disagree", []string{"questrt://client/c", "questrt://node/c"}, None, true},
		{"one malformed", []string{"questrt://node/n0", "questrt://root/n0"}, None, true},
	} {
		c := &x509.Certificate{}
		for _, s := range tc.uris {
			c.URIs = append(c.URIs, u(s))
		}
		id, err := Of(c)
		if id.Role != tc.want || (err != nil) != tc.bad {
			t.Errorf("%s: %+v %v", tc.name, id, err)
		}
	}
}

// FuzzParse: ParseString never panics; what it accepts has a role and a
// name, and URI of it parses back to the same identity.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"questrt://node/n0", "questrt://client/c", "questrt://node/", "questrt:x", "questrt://node/a%2Fb", "QUESTRT://CLIENT/x", "questrt://[::1]/x", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		id, ok, err := ParseString(s)
		if err != nil {
			if !ok || !errors.Is(err, ErrMalformed) || id != (Identity{}) {
				t.Fatalf("%q: %+v ok %v err %v", s, id, ok, err)
			}
			return
		}
		if !ok {
			if id != (Identity{}) {
				t.Fatalf("%q: not a role URI but %+v", s, id)
			}
			return
		}
		if id.Role != Node && id.Role != Client || id.Name == "" {
			t.Fatalf("%q: accepted %+v", s, id)
		}
		u, err := URI(id.Role, id.Name)
		if err != nil {
			t.Fatalf("%q: URI(%+v): %v", s, id, err)
		}
		back, ok, err := Parse(u)
		if !ok || err != nil || back != id {
			t.Fatalf("%q: %s parses to %+v %v %v", s, u, back, ok, err)
		}
		// And through text, as a certificate carries it.
		back, ok, err = ParseString(u.String())
		if !ok || err != nil || back != id {
			t.Fatalf("%q: %s parses to %+v %v %v", s, u, back, ok, err)
		}
	})
}
