// Package coord is the coordinator side of a questrt cluster node: the
// sequences a node coordinates (those created through it), their
// placement on grids of nodes chosen from the membership view, the
// engines that drive each grid's remote workers, what happens to a
// sequence whose grid loses a node, and the client API (the Decode gRPC
// service of api/decode/v1) on top, which forwards calls for sequences
// coordinated elsewhere to their node.
//
// Sequence ids are "node/instance.number": the node that coordinates the
// sequence, the membership instance of the node process that created it
// (hex) and a number it gave, which is also the sequence's engine id on
// its grid. Package coord does no compute and keeps no pages: the
// workers (package worker, over worker/remote) hold them.
//
// Nodes that persist (worker/remote ServerConfig.DataDir, questd
// --data-dir) recover a grid's sequences when its coordinator, restarted
// under the same name, opens a grid of the same shape again; the
// coordinator then adopts every sequence that all the grid's nodes
// recovered (engine.Adopt), under the id it had, and lists them with
// their lengths and lost tail tokens (Coordinator.Recovery, the Decode
// API's Recovered and Status). See adopt.go.
package coord
