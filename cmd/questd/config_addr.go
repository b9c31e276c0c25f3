package main

import (
	"net"
	"net/netip"
	"strconv"
)

// splitAddr splits a listen address whose host is an IP or empty.
func splitAddr(name, s string) (host string, port int, err error) {
	h, p, err := net.SplitHostPort(s)
	if err != nil {
		return "", 0, bad(name, s, "want host:port")
	}
	if h != "" {
		if _, err := netip.ParseAddr(h); err != nil {
			return "", 0, bad(name, s, "host %q is not an IP address", h)
		}
	}
	n, err := strconv.ParseUint(p, 10, 16)
	if err != nil {
		return "", 0, bad(name, s, "port %q: want 0-65535", p)
	}
	return h, int(n), nil
}

// unspecified reports whether host listens on every interface.
func unspecified(host string) bool {
	if host == "" {
		return true
	}
	a, err := netip.ParseAddr(host)
	return err == nil && a.IsUnspecified()
}

// advertiseHost is the IP address other nodes reach this node at:
// Advertise, or the host of GRPCAddr.
func (c Config) advertiseHost() string {
	if c.Node.Advertise != "" {
		return c.Node.Advertise
	}
	h, _, _ := net.SplitHostPort(c.Node.GRPCAddr)
	return h
}
