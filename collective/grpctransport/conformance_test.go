package grpctransport

import (
	"testing"

	"github.com/questrt/questrt/collective"
	"github.com/questrt/questrt/collective/transporttest"
)

func TestConformance(t *testing.T) {
	transporttest.Run(t, func(t *testing.T, n int) []collective.Transport {
		trs := newGroup(t, n, nil)
		out := make([]collective.Transport, n)
		for i, tr := range trs {
			out[i] = tr
		}
		return out
	})
}
