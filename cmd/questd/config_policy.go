package main

import (
	"fmt"
	"os"
	"slices"

	"github.com/questrt/questrt/plan"
)

// readPolicy reads Policy.File into c: its page size must equal Grid.PageSize
// where the page size was given, and its budget, sink, local, dense
// layers, dense rho, reuse steps and layers, GQA mode and selector
// replace the flags that were not given.
func (c *Config) readPolicy(given func(flag string) bool) error {
	f, err := os.Open(c.Policy.File)
	if err != nil {
		return err
	}
	defer f.Close()
	p, err := plan.ReadPolicyFile(f)
	if err != nil {
		return err
	}
	if p.PageSize != c.Grid.PageSize {
		if given("page-size") {
			return fmt.Errorf("its page_size %d differs from --page-size %d", p.PageSize, c.Grid.PageSize)
		}
		c.Grid.PageSize = p.PageSize
	}
	for _, v := range []struct {
		flag string
		dst  *int
		val  int
	}{
		{"budget-tokens", &c.Policy.BudgetTokens, p.BudgetTokens}, {"sink-pages", &c.Policy.SinkPages, p.SinkPages},
		{"local-pages", &c.Policy.LocalPages, p.LocalPages}, {"dense-layers", &c.Policy.DenseLayers, p.DenseLayers},
	} {
		if !given(v.flag) {
			*v.dst = v.val
		}
	}
	if !given("dense-rho") {
		c.Policy.DenseRho = p.DenseRho
	}
	if !given("reuse-steps") {
		c.Policy.ReuseSteps = p.ReuseSteps
	}
	if !given("reuse-layers") {
		c.Policy.ReuseLayers = slices.Clone(p.ReuseLayers)
	}
	if !given("gqa") {
		c.Policy.GQA = p.GQA
	}
	if !given("selector") {
		c.Policy.Selector = p.Selector
	}
	c.Policy.LayerBudget = p.LayerBudget
	return nil
}
