package collective

// The tags' ops of the benchmark's baseline rounds, for the external
// tests.
const (
	OpBaseGather = opBaseGather
	OpBaseRoot   = opBaseRoot
	OpPingPong   = opPingPong
	OpSweep      = opSweep
)

// SetCopyKeys makes g copy every select frame's keys (its own and its
// peers') instead of viewing them in place, as a big-endian machine or an
// unaligned frame does.
func SetCopyKeys(g *Group, on bool) { g.copyKeys = on }
