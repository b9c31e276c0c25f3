package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/questrt/questrt/worker/remote"
)

// verifyFlag is --verify-data: questd checks a data directory offline,
// prints a report and exits (runVerify), instead of serving.
const verifyFlag = "verify-data"

const verifyUsage = `Usage: questd --verify-data --data-dir DIR [--repair] [--lock-timeout D]

Checks every grid directory under DIR offline, as a node would open it at
its next start: every bbolt file (worker.db, store.db, index.db) opened
read-only and checked, each grid's format record against its directory's
name, then the grid opened on a copy (made under DIR and removed after)
and every page of every sequence read back against its slab record. It
prints one line per grid ("ok" or "damaged: reason", with its sequences
and their lengths), and changes nothing in DIR unless --repair.

--repair moves each grid that a node would refuse to open (damaged
metadata) aside to <grid>.corrupt-<UTC time>, as a running node does, so
that the next start opens that grid on a fresh directory. Damaged
sequences of a grid that opens are left to the node, which reports them
(Recovered, the log) and deletes them at its next open.

It takes DIR's lock: while a questd serves on DIR it refuses to run.

Exit status: 0 all ok; 1 damage found (repaired or not); 2 bad usage, or
DIR could not be verified (missing, in use by a running questd).

Flags:
`

// isVerify says whether args ask for --verify-data (before a "--").
func isVerify(args []string) bool {
	for _, a := range args {
		if a == "--" {
			return false
		}
		name, val, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if strings.HasPrefix(a, "-") && name == verifyFlag && val != "false" {
			return true
		}
	}
	return false
}

// runVerify is questd --verify-data: it returns the exit status.
func runVerify(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("questd --verify-data", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Bool(verifyFlag, true, "check DIR and exit (this mode)")
	dir := fs.String("data-dir", "", "the node's data directory (`DIR`, as questd --data-dir); required")
	repair := fs.Bool("repair", false, "move the grids a node would refuse aside to <grid>.corrupt-<UTC time>")
	lockTimeout := fs.Duration("lock-timeout", 500*time.Millisecond, "how long to wait for each bbolt file's lock before saying it is in use")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), verifyUsage)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	switch {
	case fs.NArg() > 0:
		fmt.Fprintf(stderr, "questd --verify-data: unexpected argument %q (flags only; see --verify-data --help)\n", fs.Arg(0))
		return 2
	case *dir == "":
		fmt.Fprintln(stderr, "questd --verify-data: --data-dir DIR is required")
		return 2
	}
	rep, err := remote.VerifyDataDir(ctx, *dir, remote.VerifyConfig{Repair: *repair, LockTimeout: *lockTimeout})
	if err != nil {
		fmt.Fprintf(stderr, "questd --verify-data: %s not verified: %v\n", *dir, err)
		return 2
	}
	printVerify(stdout, rep, *repair)
	if rep.Damaged() {
		return 1
	}
	return 0
}

// printVerify writes the report: one line per grid, one per sequence.
func printVerify(w io.Writer, rep remote.VerifyReport, repair bool) {
	bad := 0
	for _, g := range rep.Grids {
		switch {
		case g.OK() && g.Empty:
			fmt.Fprintf(w, "%s: ok: empty (nothing persisted yet)\n", g.Dir)
		case g.OK():
			fmt.Fprintf(w, "%s: ok: %d sequences\n", g.Dir, len(g.Sequences))
		case g.Err != nil:
			bad++
			what := "not refused by a node"
			switch {
			case g.MovedTo != "":
				what = "moved to " + g.MovedTo
			case g.Refused && !repair:
				what = "a node moves it aside at its next open; --repair does it now"
			}
			fmt.Fprintf(w, "%s: damaged: %v (%s)\n", g.Dir, g.Err, what)
		default:
			bad++
			fmt.Fprintf(w, "%s: damaged: %d of its sequences, %d slab slots (a node reports and deletes those sequences at its next open)\n",
				g.Dir, len(g.Damaged)+countBad(g.Sequences), g.CorruptSlots)
		}
		for _, s := range g.Sequences {
			state := fmt.Sprintf("ok, %d pages read", s.Pages)
			if s.Err != nil {
				state = "damaged: " + s.Err.Error()
			}
			lost := ""
			if s.LostTokens() > 0 {
				lost = fmt.Sprintf(", %d tokens to re-append (had %d)", s.LostTokens(), s.Had)
			}
			fmt.Fprintf(w, "  sequence %d of grid %s: %s tokens%s: %s\n", s.Seq, s.Grid, lens(s.Lens), lost, state)
		}
		for _, d := range g.Damaged {
			fmt.Fprintf(w, "  sequence %d: damaged: %v\n", d.Seq, d.Err)
		}
	}
	for _, q := range rep.Quarantined {
		fmt.Fprintf(w, "%s: quarantined earlier (not opened by a node, not verified)\n", q)
	}
	fmt.Fprintf(w, "%d grids: %d ok, %d damaged; %d quarantined before\n", len(rep.Grids), len(rep.Grids)-bad, bad, len(rep.Quarantined))
}

func countBad(ss []remote.SeqVerdict) int {
	n := 0
	for _, s := range ss {
		if s.Err != nil {
			n++
		}
	}
	return n
}

// lens prints per-layer lengths: one number when every layer agrees.
func lens(ls []int) string {
	if len(ls) > 0 && slices.Min(ls) == slices.Max(ls) {
		return fmt.Sprint(ls[0])
	}
	return fmt.Sprint(ls)
}
