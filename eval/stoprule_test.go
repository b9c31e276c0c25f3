package eval

import (
	"math"
	"testing"

	"github.com/questrt/questrt/decode"
)

// gapRow builds a row of 8 ranked pages whose gap at every k is gap and
// whose recall reaches 1 at page full (linear before it).
func gapRow(gap float32, full int) StopSample {
	r := StopSample{Rank: 2, StopRow: decode.StopRow{Ranked: 8, Exact: true}}
	for k := 0; k <= 8; k++ {
		rec := min(float32(k)/float32(full), 1)
		r.Gap = append(r.Gap, gap)
		r.Recall = append(r.Recall, rec)
		r.Mass = append(r.Mass, rec)
		r.MassBound = append(r.MassBound, 1-rec)
	}
	return r
}

// TestGapReport: on rows where a small gap marks the hard queries
// (recall 1 only at 4 pages) and a large gap the easy ones (1 at 2
// pages), the calibrated policy raises exactly the hard rows and beats
// fixed K at the same mean pages; the quintiles see the difference on
// both splits.
func TestGapReport(t *testing.T) {
	var dev, test []StopSample
	for i := range 40 {
		hard := i%4 == 0 // a quarter of the rows
		g, full := float32(1+i%3), 2
		if hard {
			g, full = 0.01, 4
		}
		dev = append(dev, gapRow(g, full))
		test = append(test, gapRow(g*1.1, full))
	}
	rep := gapReport(dev, test)
	if rep == nil || rep.K0 != 2 || rep.K1 != 4 {
		t.Fatalf("report %+v", rep)
	}
	// Raising the quarter of hard rows: 2.5 pages on average, recall 1.
	if math.Abs(rep.Mean-2.5) > 1e-9 || rep.Recall != 1 || rep.P95 != 4 || rep.Max != 4 {
		t.Fatalf("policy: mean %v recall %v p95 %d max %d (threshold %v)", rep.Mean, rep.Recall, rep.P95, rep.Max, rep.Threshold)
	}
	// Fixed K at 2.5 pages: half the rows at 2, half at 3. Easy rows
	// reach 1 at both; hard rows have 2/4 and 3/4.
	want := 0.75*1 + 0.25*(0.5*0.5+0.5*0.75)
	if math.Abs(rep.FixedRecall-want) > 1e-6 || math.Abs(rep.RecallK0-(0.75+0.25*0.5)) > 1e-6 || rep.RecallK1 != 1 {
		t.Fatalf("fixed: at equal pages %v (want %v), k0 %v, k1 %v", rep.FixedRecall, want, rep.RecallK0, rep.RecallK1)
	}
	if rep.DevGain <= 0 {
		t.Fatalf("dev gain %v", rep.DevGain)
	}
	// Hard rows (recall 0.5 at k0: not below Insufficient) count as
	// sufficient; make them insufficient and the lowest quintile holds
	// them all (the bin at the smallest gap that holds rows: quantile
	// edges on tied gaps leave bins empty).
	for i := range dev {
		if dev[i].Gap[2] < 0.1 {
			dev[i].Recall[2], test[i].Recall[2] = 0.25, 0.25
		}
	}
	rep = gapReport(dev, test)
	seen, rows := false, 0
	for _, b := range rep.Bins {
		rows += b.DevNo
		switch {
		case b.DevNo == 0:
		case !seen:
			seen = true
			if b.DevIns != 10 || b.TestIn != 10 || b.DevNo != 10 || b.DevP != 1 || b.TestP != 1 {
				t.Fatalf("lowest bin %+v", b)
			}
		case b.DevIns != 0 || b.TestIn != 0:
			t.Fatalf("bin %+v", b)
		}
	}
	if rows != len(dev) {
		t.Fatalf("%d rows binned of %d", rows, len(dev))
	}
}
