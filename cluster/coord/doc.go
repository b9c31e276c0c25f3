// Package coord is the coordinator side of a questrt cluster node: the
// sequences a node coordinates (those created through it), their
// placement on grids of nodes chosen from the membership view, the
// engines that drive each grid's remote workers, what happens to a
// sequence whose grid loses a node, and the client API (the Decode gRPC
// service of api/decode/v1) on top, which forwards calls for sequences
// coordinated elsewhere to their node.
//
// Sequence ids are "node/number": the node that coordinates the sequence
// and a number it gave. Package coord does no compute and keeps no pages:
// the workers (package worker, over worker/remote) hold them.
package coord
