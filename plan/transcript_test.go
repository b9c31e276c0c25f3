package plan

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
)

// TestTranscripts drives the planner from the scripts in testdata/: each
// command's output is compared with the expected text below it. After a
// deliberate change, regenerate with `go test ./plan/ -rewrite` and review
// the diff.
//
// Commands (state carries over within a file):
//
//	layout cp=N [placement=striped|contiguous] [block=B] [pages=P]
//	    owner and local index of every page, pages per rank
//	policy [page=S] [budget=B] [sink=N] [local=N] [dense-layers=N] [selector=...]
//	plan layer=L pages=P [budget=B]
//	    the sequence's plan and every rank's part of it
//	select k=K [quota=exact|union]
//	<rank>: page:score page:score ...   (one line per rank, input)
//	    each rank's proposals (its best quota of its candidates), the global top-K
func TestTranscripts(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		var (
			lay = Layout{CP: 1, TP: 1, BlockPages: 64}
			pol = DefaultPolicy()
			pl  Plan
		)
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			switch d.Cmd {
			case "layout":
				lay = Layout{CP: intArg(t, d, "cp", 1), TP: 1, BlockPages: intArg(t, d, "block", 64)}
				if d.HasArg("placement") {
					var s string
					d.ScanArgs(t, "placement", &s)
					p, err := ParsePlacement(s)
					if err != nil {
						return err.Error()
					}
					lay.Placement = p
				}
				if err := lay.Validate(lay.TP); err != nil {
					return err.Error()
				}
				return showLayout(lay, intArg(t, d, "pages", 0))
			case "policy":
				pol = DefaultPolicy()
				pol.PageSize = intArg(t, d, "page", pol.PageSize)
				pol.BudgetTokens = intArg(t, d, "budget", pol.BudgetTokens)
				pol.SinkPages = intArg(t, d, "sink", pol.SinkPages)
				pol.LocalPages = intArg(t, d, "local", pol.LocalPages)
				pol.DenseLayers = intArg(t, d, "dense-layers", pol.DenseLayers)
				if d.HasArg("selector") {
					var s string
					d.ScanArgs(t, "selector", &s)
					sel, err := ParseSelector(s)
					if err != nil {
						return err.Error()
					}
					pol.Selector = sel
				}
				if err := pol.Validate(); err != nil {
					return err.Error()
				}
				return "ok"
			case "plan":
				var err error
				pl, err = pol.Plan(intArg(t, d, "layer", 0), intArg(t, d, "pages", 0), intArg(t, d, "budget", 0))
				if err != nil {
					return err.Error()
				}
				return showPlan(lay, pl)
			case "select":
				return selectRows(t, d, lay, pl)
			}
			t.Fatalf("unknown command %q", d.Cmd)
			return ""
		})
	})
}

func intArg(t *testing.T, d *datadriven.TestData, key string, def int) int {
	if !d.HasArg(key) {
		return def
	}
	var v int
	d.ScanArgs(t, key, &v)
	return v
}

func showLayout(lay Layout, pages int) string {
	var b strings.Builder
	if pages > 0 {
		fmt.Fprintf(&b, "page: ")
		for g := range pages {
			fmt.Fprintf(&b, " %2d", g)
		}
		fmt.Fprintf(&b, "\nowner:")
		for g := range pages {
			fmt.Fprintf(&b, " %2d", lay.Owner(g))
		}
		fmt.Fprintf(&b, "\nlocal:")
		for g := range pages {
			p := lay.Place(lay.Owner(g))
			l := p.Local(g)
			if p.Global(l) != g {
				fmt.Fprintf(&b, " !%d", l) // round trip broken
				continue
			}
			fmt.Fprintf(&b, " %2d", l)
		}
		b.WriteString("\n")
	}
	if pages == 0 {
		return "ok"
	}
	for r := range lay.CP {
		fmt.Fprintf(&b, "rank %d: %d pages\n", r, lay.Place(r).Count(pages))
	}
	return b.String()
}

func showPlan(lay Layout, pl Plan) string {
	var b strings.Builder
	fmt.Fprintf(&b, "pages=%d k=%d dense=%v sink=%d local=%d rank=%d candidates=[%d,%d) reads=%d\n",
		pl.Pages, pl.K, pl.Dense, pl.Sink, pl.Local, pl.Rank, pl.Lo(), pl.Hi(), pl.Reads())
	for r := range lay.CP {
		rp := pl.On(lay.Place(r))
		fmt.Fprintf(&b, "rank %d: pages %d, forced %d (sink %v tail %v), candidates %d %v\n",
			r, rp.Pages, rp.Forced(), rp.Sink, rp.Tail, rp.Candidates(), rp.Cand)
	}
	return b.String()
}

// selectRows reads one line of "page:score" per rank, keeps on each rank
// its best quota among its candidate pages (the input must list only the
// rank's own pages), and merges the proposals with MergeTopK.
func selectRows(t *testing.T, d *datadriven.TestData, lay Layout, pl Plan) string {
	k := intArg(t, d, "k", pl.Rank)
	quota := k
	if d.HasArg("quota") {
		var q string
		d.ScanArgs(t, "quota", &q)
		if q == "union" {
			quota = UnionQuota(k, lay.CP)
		}
	}
	var b strings.Builder
	var props, exact [][]Candidate
	for _, line := range strings.Split(strings.TrimSpace(d.Input), "\n") {
		rs, rest, ok := strings.Cut(line, ":")
		r, err := strconv.Atoi(strings.TrimSpace(rs))
		if !ok || err != nil || r < 0 || r >= lay.CP {
			t.Fatalf("bad rank line %q", line)
		}
		place := lay.Place(r)
		var cands []Candidate
		for _, f := range strings.Fields(rest) {
			ps, ss, _ := strings.Cut(f, ":")
			g, err1 := strconv.Atoi(ps)
			s, err2 := strconv.ParseFloat(ss, 32)
			if err1 != nil || err2 != nil {
				t.Fatalf("bad candidate %q", f)
			}
			if place.Local(g) < 0 {
				return fmt.Sprintf("page %d is not on rank %d", g, r)
			}
			if g < pl.Lo() || g >= pl.Hi() {
				continue // forced or past the end: never ranked
			}
			cands = append(cands, Candidate{Score: float32(s), Page: int32(g)})
		}
		best := bestOf(cands, quota)
		props = append(props, best)
		exact = append(exact, bestOf(cands, k))
		fmt.Fprintf(&b, "rank %d proposes %v\n", r, pages(best))
	}
	top, err := MergeTopK(nil, k, exact...)
	if err != nil {
		return err.Error()
	}
	fmt.Fprintf(&b, "global top-%d: %v\n", k, top)
	if quota != k {
		var u []int32
		for _, p := range props {
			u = append(u, pages(p)...)
		}
		slices.Sort(u)
		fmt.Fprintf(&b, "union (quota %d) reads: %v\n", quota, u)
	}
	return b.String()
}

// bestOf returns the best k of cands by Compare.
func bestOf(cands []Candidate, k int) []Candidate {
	c := slices.Clone(cands)
	slices.SortFunc(c, Compare)
	return c[:min(k, len(c))]
}

// pages returns the pages of cands, ascending.
func pages(cands []Candidate) []int32 {
	var out []int32
	for _, c := range cands {
		out = append(out, c.Page)
	}
	slices.Sort(out)
	return out
}
