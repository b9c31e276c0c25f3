// Package redact keeps network addresses out of the texts a questrt node
// hands to its clients: error messages of the client API and the reasons
// it reports, which may quote what gRPC or net said about a peer ("dial
// tcp 10.0.0.7:7001: connect: connection refused"). The node logs the
// whole text; the client gets it with each address replaced.
package redact

import "regexp"

// Placeholder replaces each address.
const Placeholder = "<addr>"

// peerAddr matches bracketed IPv6 addresses (a zone too; with a port or
// not), IPv4
// addresses (with a port or not) and host names with a port (a name with
// at least one letter, then :NN to :NNNNN).
var peerAddr = regexp.MustCompile(`\[[0-9A-Fa-f]*:[0-9A-Za-z:.%_-]*\](?::\d{1,5})?` +
	`|\b(?:\d{1,3}\.){3}\d{1,3}(?::\d{1,5})?\b` +
	`|\b[A-Za-z0-9-]*[A-Za-z][A-Za-z0-9-]*(?:\.[A-Za-z0-9-]+)*:\d{2,5}\b`)

// Addresses returns msg with every network address replaced by
// Placeholder, and whether it replaced any.
func Addresses(msg string) (string, bool) {
	out := peerAddr.ReplaceAllString(msg, Placeholder)
	return out, out != msg
}
