package node

// AllowForeignCert lets Start run a node with a certificate its peers
// refuse (a client's, another node's): the rogue joiners of
// TestRogueJoinersNeverPlaced, which an attacker could run with any
// gRPC server.
func AllowForeignCert(c *Config) { c.foreignCert = true }
