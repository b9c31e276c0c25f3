package wire

import (
	"errors"
	"fmt"
	"math"

	workerv1 "github.com/questrt/questrt/api/worker/v1"
	"github.com/questrt/questrt/plan"
)

// PolicyProto encodes p as the Policy message of a grid config (the
// caller sets its page size: a grid's is its geometry's, see
// plan.Policy.WithGeometry). SummaryDType does not travel: it is each
// node's backend's. A negative count is an error naming the field; the
// message then holds 0 in its place.
func PolicyProto(p plan.Policy) (*workerv1.Policy, error) {
	var err error
	lb := make(map[uint32]uint32, len(p.LayerBudget))
	for l, b := range p.LayerBudget {
		lb[u32("layer budget layer", l, &err)] = u32("layer budget", b, &err)
	}
	m := &workerv1.Policy{
		PageSize: u32("policy page size", p.PageSize, &err), BudgetTokens: u32("budget tokens", p.BudgetTokens, &err),
		SinkPages: u32("sink pages", p.SinkPages, &err), LocalPages: u32("local pages", p.LocalPages, &err),
		DenseLayers: u32("dense layers", p.DenseLayers, &err), LayerBudget: lb,
		Gqa: p.GQA.String(), Selector: p.Selector.String(), DenseRho: p.DenseRho,
		HierGroup: u32("hier group", p.HierGroup, &err), TopP: p.TopP,
		SubBoxes: u32("sub boxes", p.SubBoxes, &err), ReuseSteps: u32("reuse steps", p.ReuseSteps, &err),
	}
	for _, l := range p.ReuseLayers {
		m.ReuseLayers = append(m.ReuseLayers, u32("reuse layer", l, &err))
	}
	return m, err
}

// Policy decodes a grid config's Policy message (not validated: see
// plan.Policy.Validate). An error names the field.
func Policy(m *workerv1.Policy) (plan.Policy, error) {
	if m == nil {
		return plan.Policy{}, errors.New("policy: missing")
	}
	var err error
	p := plan.Policy{
		PageSize: toInt("policy page size", m.GetPageSize(), &err), BudgetTokens: toInt("budget tokens", m.GetBudgetTokens(), &err),
		SinkPages: toInt("sink pages", m.GetSinkPages(), &err), LocalPages: toInt("local pages", m.GetLocalPages(), &err),
		DenseLayers: toInt("dense layers", m.GetDenseLayers(), &err), DenseRho: m.GetDenseRho(),
		HierGroup: toInt("hier group", m.GetHierGroup(), &err), TopP: m.GetTopP(),
		SubBoxes: toInt("sub boxes", m.GetSubBoxes(), &err), ReuseSteps: toInt("reuse steps", m.GetReuseSteps(), &err),
	}
	for _, l := range m.GetReuseLayers() {
		p.ReuseLayers = append(p.ReuseLayers, toInt("reuse layer", l, &err))
	}
	if lb := m.GetLayerBudget(); len(lb) > 0 {
		p.LayerBudget = make(map[int]int, len(lb))
		for l, b := range lb {
			p.LayerBudget[toInt("layer budget layer", l, &err)] = toInt("layer budget", b, &err)
		}
	}
	var perr error
	if p.GQA, perr = plan.ParseGQAMode(m.GetGqa()); perr != nil && err == nil {
		err = fmt.Errorf("policy: %w", perr)
	}
	if p.Selector, perr = plan.ParseSelector(m.GetSelector()); perr != nil && err == nil {
		err = fmt.Errorf("policy: %w", perr)
	}
	return p, err
}

// toInt converts a wire count to int, keeping the first error in *err
// (a count over MaxInt: a 32-bit platform).
func toInt(what string, v uint32, err *error) int {
	if uint64(v) > math.MaxInt {
		if *err == nil {
			*err = fmt.Errorf("%s %d overflows int", what, v)
		}
		return 0
	}
	return int(v)
}
