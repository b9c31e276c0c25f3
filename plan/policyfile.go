package plan

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"
)

// DenseBudget is the per-layer token budget that makes a layer dense at
// any context below 2^31 tokens (K = B/S >= P): how a policy file's dense
// layers past the leading DenseLayers are expressed in LayerBudget.
const DenseBudget = math.MaxInt32

// maxPolicyFile bounds the bytes ReadPolicyFile reads.
const maxPolicyFile = 1 << 20

// PolicyFile is the YAML form of a Policy, as `questctl calibrate` writes
// it and `questctl generate`/`eval` and questd read it (--policy FILE):
//
//	page_size: 16
//	budget: 2048          # tokens, the layers without their own budget
//	sink: 0
//	local: 1
//	gqa: group_max
//	selector: quest
//	summary_dtype: fp8    # bf16 (default: the K/V type) or fp8
//	hier_group: 8         # exact top-K over boxes of 8 pages (0: flat)
//	top_p: 0.95           # keep the tokens reaching this softmax mass (0: off)
//	dense: [0, 1]         # layers that read every page
//	dense_rho: 0.25       # a layer reads every page while 1/S + K/P >= it
//	reuse_steps: 4        # rank afresh every 4th step, reuse in between (0: off)
//	reuse_layers: [3, 5]  # layers that attend the previous layer's selection
//	layer_budget:         # layer: tokens
//	  2: 256
//	  3: 512
//
// Every key is optional (absent: DefaultPolicy's value); unknown keys are
// errors.
type PolicyFile struct {
	PageSize *int   `yaml:"page_size,omitempty" json:"page_size,omitempty"`
	Budget   *int   `yaml:"budget,omitempty" json:"budget,omitempty"`
	Sink     *int   `yaml:"sink,omitempty" json:"sink,omitempty"`
	Local    *int   `yaml:"local,omitempty" json:"local,omitempty"`
	GQA      string `yaml:"gqa,omitempty" json:"gqa,omitempty"`
	Selector string `yaml:"selector,omitempty" json:"selector,omitempty"`
	// SummaryDType is Policy.SummaryDType's name ("" for the default).
	SummaryDType string `yaml:"summary_dtype,omitempty" json:"summary_dtype,omitempty"`
	// HierGroup is Policy.HierGroup (absent or 0: flat scoring).
	HierGroup *int `yaml:"hier_group,omitempty" json:"hier_group,omitempty"`
	// SubBoxes is Policy.SubBoxes (absent, 0 or 1: one box per page).
	SubBoxes *int `yaml:"sub_boxes,omitempty" json:"sub_boxes,omitempty"`
	// ReuseSteps is Policy.ReuseSteps (absent, 0 or 1: every step ranks).
	ReuseSteps *int `yaml:"reuse_steps,omitempty" json:"reuse_steps,omitempty"`
	// ReuseLayers is Policy.ReuseLayers (absent or empty: every sparse
	// layer ranks).
	ReuseLayers []int `yaml:"reuse_layers,omitempty" json:"reuse_layers,omitempty"`
	// TopP is Policy.TopP (absent or 0: off).
	TopP  float64 `yaml:"top_p,omitempty" json:"top_p,omitempty"`
	Dense []int   `yaml:"dense" json:"dense"`
	// DenseRho is Policy.DenseRho (absent or 0: off).
	DenseRho    float64     `yaml:"dense_rho,omitempty" json:"dense_rho,omitempty"`
	LayerBudget map[int]int `yaml:"layer_budget,omitempty" json:"layer_budget,omitempty"`
}

// ErrPolicyFile marks a policy file that cannot be used.
var ErrPolicyFile = errors.New("policy file")

// ReadPolicyFile decodes a policy file (strict YAML, at most 1 MiB) and
// returns its validated Policy. The leading run of dense layers 0..N-1
// becomes DenseLayers = N; any other dense layer gets LayerBudget =
// DenseBudget. A layer both dense and budgeted is an error.
func ReadPolicyFile(r io.Reader) (Policy, error) {
	b, err := io.ReadAll(io.LimitReader(r, maxPolicyFile+1))
	if err != nil {
		return Policy{}, fmt.Errorf("%w: %w", ErrPolicyFile, err)
	}
	if len(b) > maxPolicyFile {
		return Policy{}, fmt.Errorf("%w: larger than %d bytes", ErrPolicyFile, maxPolicyFile)
	}
	var f PolicyFile
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil && !errors.Is(err, io.EOF) {
		return Policy{}, fmt.Errorf("%w: %w", ErrPolicyFile, err)
	}
	var extra any
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return Policy{}, fmt.Errorf("%w: more than one YAML document", ErrPolicyFile)
	}
	p, err := f.Policy()
	if err != nil {
		return Policy{}, fmt.Errorf("%w: %w", ErrPolicyFile, err)
	}
	return p, nil
}

// Policy converts the file into a validated Policy.
func (f PolicyFile) Policy() (Policy, error) {
	p := DefaultPolicy()
	set := func(dst *int, v *int) {
		if v != nil {
			*dst = *v
		}
	}
	set(&p.PageSize, f.PageSize)
	set(&p.BudgetTokens, f.Budget)
	set(&p.SinkPages, f.Sink)
	set(&p.LocalPages, f.Local)
	p.DenseRho = f.DenseRho
	set(&p.HierGroup, f.HierGroup)
	set(&p.SubBoxes, f.SubBoxes)
	set(&p.ReuseSteps, f.ReuseSteps)
	p.ReuseLayers = slices.Clone(f.ReuseLayers)
	p.TopP = f.TopP
	if f.GQA != "" {
		m, err := ParseGQAMode(f.GQA)
		if err != nil {
			return Policy{}, fmt.Errorf("gqa: %w", err)
		}
		p.GQA = m
	}
	if f.Selector != "" {
		s, err := ParseSelector(f.Selector)
		if err != nil {
			return Policy{}, fmt.Errorf("selector: %w", err)
		}
		p.Selector = s
	}
	if f.SummaryDType != "" {
		d, err := ParseSummaryDType(f.SummaryDType)
		if err != nil {
			return Policy{}, fmt.Errorf("summary_dtype: %w", err)
		}
		p.SummaryDType = d
	}
	dense := slices.Clone(f.Dense)
	slices.Sort(dense)
	if len(slices.Compact(slices.Clone(dense))) != len(dense) {
		return Policy{}, fmt.Errorf("dense %v: a layer is listed twice", f.Dense)
	}
	p.DenseLayers = 0
	for _, l := range dense {
		if l < 0 {
			return Policy{}, fmt.Errorf("dense: layer %d is negative", l)
		}
		if l == p.DenseLayers {
			p.DenseLayers++
		}
	}
	if f.Dense == nil {
		p.DenseLayers = DefaultPolicy().DenseLayers
	}
	if len(f.LayerBudget) > 0 || len(dense) > p.DenseLayers {
		p.LayerBudget = map[int]int{}
	}
	for l, b := range f.LayerBudget {
		if l < 0 {
			return Policy{}, fmt.Errorf("layer_budget: layer %d is negative", l)
		}
		if slices.Contains(dense, l) {
			return Policy{}, fmt.Errorf("layer %d is both dense and given a budget of %d", l, b)
		}
		p.LayerBudget[l] = b
	}
	for _, l := range dense {
		if l >= p.DenseLayers {
			p.LayerBudget[l] = DenseBudget
		}
	}
	return p, p.Validate()
}

// FilePolicy returns the file form of p (the inverse of PolicyFile.Policy
// for validated policies).
func FilePolicy(p Policy) PolicyFile {
	f := PolicyFile{PageSize: &p.PageSize, Budget: &p.BudgetTokens, Sink: &p.SinkPages, Local: &p.LocalPages,
		GQA: p.GQA.String(), Selector: p.Selector.String(), Dense: []int{}, DenseRho: p.DenseRho, TopP: p.TopP}
	if p.SummaryDType != SummaryKV {
		f.SummaryDType = p.SummaryDType.String()
	}
	if p.HierGroup != 0 {
		f.HierGroup = &p.HierGroup
	}
	if p.SubBoxes != 0 {
		f.SubBoxes = &p.SubBoxes
	}
	if p.ReuseSteps != 0 {
		f.ReuseSteps = &p.ReuseSteps
	}
	f.ReuseLayers = slices.Clone(p.ReuseLayers)
	for l := range p.DenseLayers {
		f.Dense = append(f.Dense, l)
	}
	for l, b := range p.LayerBudget {
		if b >= DenseBudget {
			if l >= p.DenseLayers {
				f.Dense = append(f.Dense, l)
			}
			continue
		}
		if l < p.DenseLayers {
			continue // dense anyway
		}
		if f.LayerBudget == nil {
			f.LayerBudget = map[int]int{}
		}
		f.LayerBudget[l] = b
	}
	slices.Sort(f.Dense)
	return f
}

// WritePolicyFile writes p as a policy file, after the comment lines of
// header (each prefixed with "# ").
func WritePolicyFile(w io.Writer, p Policy, header string) error {
	if err := p.Validate(); err != nil {
		return err
	}
	var b bytes.Buffer
	for _, line := range strings.Split(strings.TrimRight(header, "\n"), "\n") {
		if header != "" {
			fmt.Fprintf(&b, "# %s\n", line)
		}
	}
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(FilePolicy(p)); err != nil {
		return err
	}
	if err := enc.Close(); err != nil {
		return err
	}
	_, err := w.Write(b.Bytes())
	return err
}

// IsDenseLayer reports whether layer reads every page under p at any
// context below 2^31 tokens (a leading dense layer, a DenseBudget layer
// or the dense selector).
func (p Policy) IsDenseLayer(layer int) bool {
	return layer < p.DenseLayers || p.Selector == Dense || p.LayerBudget[layer] >= DenseBudget
}
