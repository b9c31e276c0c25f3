// Package rankproc runs the collective benchmark with one process per
// rank, as `questctl bench collective --nodes` does: the parent
// (Launcher, Bench, Sweep) starts N children of a program, each running
// RunRank behind a command line of the caller's, and coordinates them
// over their stdin and stdout:
//
//	child  -> parent  {"rank":R,"pid":P,"addr":"127.0.0.1:PORT"}  once it listens (Hello)
//	parent -> child   {"peers":["ADDR0","ADDR1",...]}               once all listen (Peers)
//	child  -> parent  collective.BenchSamples as one JSON line      at the end
//	                  (collective.SweepSamples for a sweep)
//
// then the child exits 0. A child stops when its stdin closes (the parent
// is gone) or its timeout passes; on Linux it can also get SIGTERM when
// the parent dies (Launcher.SysProcAttr). The parent combines the
// ranks' samples with collective.BenchCombine or SweepCombine.
package rankproc
