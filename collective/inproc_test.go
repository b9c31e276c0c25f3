package collective_test

import (
	"testing"
	"time"

	"github.com/questrt/questrt/collective"
	"github.com/questrt/questrt/collective/transporttest"
)

func TestInprocConformance(t *testing.T) {
	transporttest.Run(t, func(t *testing.T, n int) []collective.Transport {
		return collective.NewInprocGroup(n)
	})
}

// A Faulty wrapper without faults, or with only a delay, is a conforming
// transport too.
func TestFaultyConformance(t *testing.T) {
	for _, delay := range []time.Duration{0, 100 * time.Microsecond} {
		t.Run(delay.String(), func(t *testing.T) {
			transporttest.Run(t, func(t *testing.T, n int) []collective.Transport {
				trs := collective.NewInprocGroup(n)
				for i, tr := range trs {
					trs[i] = &collective.Faulty{Transport: tr, Delay: delay}
				}
				return trs
			})
		})
	}
}

func TestNewInprocGroupPanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("NewInprocGroup(0) did not panic")
		}
	}()
	collective.NewInprocGroup(0)
}
