package main

import (
	"fmt"
	"os"

	"github.com/questrt/questrt/plan"
)

// readPolicy reads PolicyFile into c: its page size must equal PageSize
// where the page size was given, and its budget, sink, local, dense
// layers, GQA mode and selector replace the flags that were not given.
func (c *Config) readPolicy(given func(flag string) bool) error {
	f, err := os.Open(c.PolicyFile)
	if err != nil {
		return err
	}
	defer f.Close()
	p, err := plan.ReadPolicyFile(f)
	if err != nil {
		return err
	}
	if p.PageSize != c.PageSize {
		if given("page-size") {
			return fmt.Errorf("its page_size %d differs from --page-size %d", p.PageSize, c.PageSize)
		}
		c.PageSize = p.PageSize
	}
	for _, v := range []struct {
		flag string
		dst  *int
		val  int
	}{
		{"budget-tokens", &c.BudgetTokens, p.BudgetTokens}, {"sink-pages", &c.SinkPages, p.SinkPages},
		{"local-pages", &c.LocalPages, p.LocalPages}, {"dense-layers", &c.DenseLayers, p.DenseLayers},
	} {
		if !given(v.flag) {
			*v.dst = v.val
		}
	}
	if !given("dense-rho") {
		c.DenseRho = p.DenseRho
	}
	if !given("reuse-steps") {
		c.ReuseSteps = p.ReuseSteps
	}
	if !given("gqa") {
		c.GQA = p.GQA
	}
	if !given("selector") {
		c.Selector = p.Selector
	}
	c.LayerBudget = p.LayerBudget
	return nil
}
