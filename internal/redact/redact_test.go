package redact

import "testing"

func TestAddresses(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{`rpc error: code = Unavailable desc = connection error: desc = "transport: Error while dialing: dial tcp 10.0.0.7:7001: connect: connection refused"`,
			`rpc error: code = Unavailable desc = connection error: desc = "transport: Error while dialing: dial tcp <addr>: connect: connection refused"`},
		{`open grid g1 on [n0 n1]: node n1 at "127.0.0.1:43211": unavailable`, `open grid g1 on [n0 n1]: node n1 at "<addr>": unavailable`},
		{`dial tcp [::1]:7001: refused; dial tcp [fe80::1%eth0]:9: x`, `dial tcp <addr>: refused; dial tcp <addr>: x`},
		{`lookup questd-2.questd.default.svc.cluster.local:7001 failed`, `lookup <addr> failed`},
		{`dial tcp localhost:7001: refused, then 192.168.1.20 did not answer`, `dial tcp <addr>: refused, then <addr> did not answer`},
		// No address: unchanged.
		{`sequence "n0/1234.5": not found`, `sequence "n0/1234.5": not found`},
		{`step 3 of layer 12: 7 rows, want 8 (questrt://node/n1)`, `step 3 of layer 12: 7 rows, want 8 (questrt://node/n1)`},
		{`code = Unavailable desc = the grid was lost at 12:30`, `code = Unavailable desc = the grid was lost at 12:30`},
		{`budget 1.5 of 2.0: rho 0.1874`, `budget 1.5 of 2.0: rho 0.1874`},
	} {
		got, changed := Addresses(c.in)
		if got != c.want || changed != (c.in != c.want) {
			t.Errorf("Addresses(%q) = %q, %v; want %q, %v", c.in, got, changed, c.want, c.in != c.want)
		}
	}
}
