package client

import (
	"reflect"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	workerv1 "github.com/questrt/questrt/api/worker/v1"
	"github.com/questrt/questrt/plan"
	"github.com/questrt/questrt/worker"
	"github.com/questrt/questrt/worker/remote"
)

// TestGeometryOf reads the geometry of a GridConfig as the nodes encode
// a worker.Config (remote.GridConfigProto), and refuses, naming the
// reason, what does not decode (geometryOf) or is not a usable grid
// (check, which Dial applies to a node's Status).
func TestGeometryOf(t *testing.T) {
	c := worker.DefaultConfig()
	c.CP, c.TP, c.Mode = 2, 2, plan.Union
	c.Policy.Selector, c.Policy.LayerBudget = plan.Dense, map[int]int{3: 64}
	pc := remote.GridConfigProto(c)
	g, err := geometryOf(pc)
	if err != nil {
		t.Fatal(err)
	}
	want := Geometry{Layers: c.Layers, QHeads: c.QHeads, KVHeads: c.KVHeads, HeadDim: c.HeadDim, PageSize: c.PageSize,
		CP: 2, TP: 2, Policy: c.Policy.WithGeometry(c.Geometry), Selection: plan.Union}
	if !reflect.DeepEqual(g, want) {
		t.Fatalf("geometry %+v\nwant %+v", g, want)
	}
	if err := g.check(); err != nil {
		t.Fatalf("check: %v", err)
	}

	for _, tc := range []struct {
		name string
		mut  func(*workerv1.GridConfig)
		want string
	}{
		{"no policy", func(g *workerv1.GridConfig) { g.Policy = nil }, "policy: missing"},
		{"unknown mode", func(g *workerv1.GridConfig) { g.Mode = "sideways" }, "mode: "},
		{"unknown selector", func(g *workerv1.GridConfig) { g.Policy.Selector = "psychic" }, "policy: "},
	} {
		bad := proto.Clone(pc).(*workerv1.GridConfig)
		tc.mut(bad)
		if _, err := geometryOf(bad); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error naming %q", tc.name, err, tc.want)
		}
	}
	if _, err := geometryOf(nil); err == nil {
		t.Error("a missing config decodes")
	}

	for _, tc := range []struct {
		name string
		mut  func(*Geometry)
		want string
	}{
		{"no layers", func(g *Geometry) { g.Layers = 0 }, "0 layers"},
		{"no cp", func(g *Geometry) { g.CP = 0 }, "cp 0"},
		{"kv heads over tp", func(g *Geometry) { g.TP = 3 }, "do not split over tp 3"},
		{"heads", func(g *Geometry) { g.QHeads = 12 }, "not a multiple"},
		{"budget below a page", func(g *Geometry) { g.Policy.BudgetTokens = 8 }, "below one page"},
	} {
		bad := want
		tc.mut(&bad)
		if err := bad.check(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error naming %q", tc.name, err, tc.want)
		}
	}
}
