package collective

// The tags' ops of the benchmark's baseline rounds, for the external
// tests.
const (
	OpBaseGather = opBaseGather
	OpBaseRoot   = opBaseRoot
	OpPingPong   = opPingPong
	OpSweep      = opSweep
)
