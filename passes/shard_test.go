package passes_test

import (
	"fmt"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/examples/gpt"
	"gcompile/frontend"
	"gcompile/ir"
	"gcompile/passes"
)

// The data-parallel tests compile a one-layer GPT (16 params: wte, wpe,
// ln_1 γ/β, c_attn w/b, attn c_proj w/b, ln_2 γ/β, c_fc w/b, mlp c_proj
// w/b, ln_f γ/β) whose every param dim divides by 2 and 4.
const shardGPTParams = 16

var zeroStages = []int{0, 1, 2, 3}

var dpSizes = []int{2, 4}

func buildShardGPT(t *testing.T, batch int) *ir.Module {
	t.Helper()
	m, err := frontend.Build(gpt.Model, frontend.Config{
		Name:  "gpt",
		Batch: batch,
		Set:   map[string]string{"layers": "1", "hidden": "32", "heads": "4", "seq": "16"},
	})
	require.NoError(t, err)
	return m
}

func dpMesh(n int) *ir.Mesh { return &ir.Mesh{Axes: []ir.MeshAxis{{Name: "dp", Size: n}}} }

// shardOpts are the default options on a dp mesh with the verifier on.
func shardOpts(dp, zero int) *passes.Options {
	o := passes.DefaultOptions()
	o.Verify = true
	o.Mesh = dpMesh(dp)
	o.Zero = zero
	return o
}

// compileDP runs every pass on the tiny GPT (batch 8) over dp devices.
func compileDP(t *testing.T, dp, zero int, tweak func(*passes.Options)) (*ir.Module, []passes.Result) {
	t.Helper()
	m := buildShardGPT(t, 8)
	o := shardOpts(dp, zero)
	if tweak != nil {
		tweak(o)
	}
	res, err := passes.Run(m, o, passes.Hooks{})
	require.NoError(t, err)
	return m, res
}

// forEachDP runs f as a subtest for every dp size and ZeRO stage.
func forEachDP(t *testing.T, f func(t *testing.T, dp, zero int)) {
	for _, dp := range dpSizes {
		for _, zero := range zeroStages {
			t.Run(fmt.Sprintf("dp=%d/zero=%d", dp, zero), func(t *testing.T) { f(t, dp, zero) })
		}
	}
}

var (
	pR  = []ir.Placement{{Kind: ir.Replicate}}
	pP  = []ir.Placement{{Kind: ir.Partial}}
	pS0 = []ir.Placement{{Kind: ir.Shard, Dim: 0}}
)

func isReduction(v *ir.Value) bool { return v.Op == "all_reduce" || v.Op == "reduce_scatter" }

// collectiveCounts counts the placement-changing ops by "op/phase".
func collectiveCounts(m *ir.Module) map[string]int {
	n := map[string]int{}
	for _, v := range m.Values {
		switch v.Op {
		case "all_reduce", "reduce_scatter", "all_gather", "shard_slice", "all_to_all", "redistribute":
			n[v.Op+"/"+v.Meta.Phase.String()]++
		}
	}
	return n
}

func withoutPhase(n map[string]int, phase string) map[string]int {
	out := map[string]int{}
	for k, c := range n {
		if !strings.HasSuffix(k, "/"+phase) {
			out[k] = c
		}
	}
	return out
}

// users maps each value to the values that take it as an arg, in order.
func users(m *ir.Module) map[*ir.Value][]*ir.Value {
	u := map[*ir.Value][]*ir.Value{}
	for _, v := range m.Values {
		for _, a := range v.Args {
			u[a] = append(u[a], v)
		}
	}
	return u
}

func TestShardPlacements(t *testing.T) {
	forEachDP(t, func(t *testing.T, dp, zero int) {
		m, res := compileDP(t, dp, zero, nil)
		require.NotNil(t, m.Mesh)
		assert.Equal(t, dpMesh(dp).String(), m.Mesh.String())
		changed := map[string]bool{}
		for _, r := range res {
			assert.Empty(t, r.Skipped, r.Name)
			changed[r.Name] = r.Changed
		}
		assert.True(t, changed["shard"], "shard places every value")
		assert.True(t, changed["redistribute"], "redistribute expands the redistribute ops")
		assert.True(t, changed["data-parallel"], "data-parallel assigns buckets")

		params, states := 0, 0
		for _, v := range m.Values {
			require.Len(t, v.Place, 1, "%s has no placement on the dp axis", v.Where())
			switch v.Op {
			case "input":
				switch v.Name() {
				case "tokens", "targets":
					assert.Equal(t, pS0, v.Place, "%s is split over the batch", v.Name())
				case "lr", "step":
					assert.Equal(t, pR, v.Place, "%s is a scalar every device needs", v.Name())
				default:
					t.Errorf("unexpected input %s", v.Where())
				}
			case "param":
				params++
				want := pR
				if zero >= 3 {
					want = pS0
				}
				assert.Equal(t, want, v.Place, "param %s under ZeRO-%d", v.Name(), zero)
			case "state":
				states++
				want := pR
				if zero >= 1 {
					want = pS0
				}
				assert.Equal(t, want, v.Place, "optimizer state %s under ZeRO-%d", v.Name(), zero)
			}
		}
		assert.Equal(t, shardGPTParams, params)
		assert.Equal(t, 2*shardGPTParams, states, "AdamW keeps m and v per param")

		for _, name := range []string{"loss", "grad_norm"} {
			o := m.Output(name)
			require.NotNil(t, o, name)
			assert.Equal(t, pR, o.Place, "output %s is whole on every device", name)
		}
		for _, u := range m.Updates {
			assert.Equal(t, u.State.Place, u.Value.Place, "update of %s keeps its placement", u.State.Name())
		}
		require.NoError(t, ir.Verify(m, "data-parallel"))
	})
}

// TestShardOneDevice: no mesh, or a mesh of one device, changes nothing.
func TestShardOneDevice(t *testing.T) {
	plain := buildShardGPT(t, 8)
	opts := passes.DefaultOptions()
	opts.Verify = true
	_, err := passes.Run(plain, opts, passes.Hooks{})
	require.NoError(t, err)
	meshes := map[string]*ir.Mesh{"none": nil, "dp=1": dpMesh(1), "dp=1,tp=1": {Axes: []ir.MeshAxis{{Name: "dp", Size: 1}, {Name: "tp", Size: 1}}}}
	for name, mesh := range meshes {
		t.Run(name, func(t *testing.T) {
			m := buildShardGPT(t, 8)
			o := passes.DefaultOptions()
			o.Verify = true
			o.Mesh = mesh
			o.Zero = 3 // ZeRO over one device shards nothing
			res, err := passes.Run(m, o, passes.Hooks{})
			require.NoError(t, err)
			for _, r := range res[indexOf(t, res, "optimizer")+1:] {
				assert.False(t, r.Changed, r.Name)
			}
			assert.Nil(t, m.Mesh)
			assert.Equal(t, ir.Print(plain), ir.Print(m))
		})
	}
}

// TestShardCollectives checks the collectives of every ZeRO stage that
// are placed in the forward and backward phases, the parameter slices and
// gathers of the update, and where the reductions sit. The optimizer-phase
// gradient reductions are checked by TestShardReducesEachGradientOnce.
func TestShardCollectives(t *testing.T) {
	forEachDP(t, func(t *testing.T, dp, zero int) {
		m, _ := compileDP(t, dp, zero, nil)
		got := collectiveCounts(m)
		for _, v := range m.Values {
			assert.NotEqual(t, "redistribute", v.Op, "redistribute leaves no redistribute op: %s", v.Where())
			switch v.Op {
			case "all_reduce", "reduce_scatter", "all_gather", "shard_slice", "all_to_all":
				assert.Equal(t, "dp", v.Attrs.Str("axis"), v.Where())
			}
		}

		// Forward and backward: the loss is all-reduced (a partial mean),
		// bias and position-embedding broadcasts are made at the local
		// batch (split, never whole and sliced), gradients are all-reduced (ZeRO 0) or
		// reduce-scattered (ZeRO 1–3) as soon as they exist, and ZeRO-3
		// gathers every param before its forward use and the 8 params the
		// backward reads (wte, the four matrices, the three LayerNorm γ).
		want := map[string]int{"all_reduce/fwd": 1}
		for _, v := range m.Values {
			if v.Op == "broadcast" && v.Type.Rank() == 3 {
				assert.Equal(t, "[S(0)]", fmt.Sprint(v.Place), "a batch-shaped broadcast is split over dp: %s", v.Where())
			}
		}
		if zero < 1 {
			want["all_reduce/bwd"] = shardGPTParams
		} else {
			want["reduce_scatter/bwd"] = shardGPTParams
		}
		if zero == 3 {
			want["all_gather/fwd"] = shardGPTParams
			want["all_gather/bwd"] = 8
		}
		if !assert.Equal(t, want, withoutPhase(got, "opt"), "fwd/bwd collectives") {
			t.Logf("%s", ir.Print(m))
		}

		// The update: ZeRO-1/2 slice each whole param to its shard, update
		// the shard and all-gather it back; ZeRO-0 updates whole params,
		// ZeRO-3 updates the shards it stores and gathers nothing after.
		paramSlices, gathers := 0, 0
		for _, v := range m.Values {
			if v.Meta.Phase != ir.PhaseOpt {
				continue
			}
			switch v.Op {
			case "shard_slice":
				if v.Args[0].Op == "param" {
					paramSlices++
				}
			case "all_gather":
				gathers++
				assert.Equal(t, "adamw", v.Args[0].Op, "only updated params are gathered in the optimizer: %s", v.Where())
			}
		}
		wantSlices, wantGathers := 0, 0
		if zero == 1 || zero == 2 {
			wantSlices, wantGathers = shardGPTParams, shardGPTParams
		}
		assert.Equal(t, wantSlices, paramSlices, "params sliced for the update")
		assert.Equal(t, wantGathers, gathers, "updated params all-gathered")
		assert.Equal(t, wantGathers, got["all_gather/opt"])
		for _, u := range m.Updates {
			if u.State.Op != "param" {
				assert.Contains(t, []string{"adam_m", "adam_v"}, u.Value.Op, "state %s is updated in place", u.State.Name())
				continue
			}
			if zero == 1 || zero == 2 {
				require.Equal(t, "all_gather", u.Value.Op, "param %s", u.State.Name())
				assert.Equal(t, "adamw", u.Value.Args[0].Op)
				assert.Equal(t, pS0, u.Value.Args[0].Place)
			} else {
				assert.Equal(t, "adamw", u.Value.Op, "param %s: no gather after the update", u.State.Name())
			}
		}

		// The global norm sums the reduced gradients: whole ones without
		// ZeRO, shards (then one all-reduce of the partial sum) under 1–3.
		var norm *ir.Value
		for _, v := range m.Values {
			if v.Op == "sum_squares" {
				require.Nil(t, norm, "one global norm")
				norm = v
			}
		}
		require.NotNil(t, norm)
		require.Len(t, norm.Args, shardGPTParams)
		for _, g := range norm.Args {
			assert.Equal(t, ir.PhaseBwd, g.Meta.Phase, g.Where())
			if zero < 1 {
				assert.Equal(t, "all_reduce", g.Op, g.Where())
			} else {
				assert.Equal(t, "reduce_scatter", g.Op, g.Where())
			}
		}
		sqrt := m.Output("grad_norm")
		require.Equal(t, "sqrt", sqrt.Op)
		if zero < 1 {
			assert.Equal(t, pR, norm.Place)
			assert.Same(t, norm, sqrt.Args[0])
		} else {
			assert.Equal(t, pP, norm.Place)
			require.Equal(t, "all_reduce", sqrt.Args[0].Op)
			assert.Same(t, norm, sqrt.Args[0].Args[0])
			assert.Equal(t, ir.PhaseOpt, sqrt.Args[0].Meta.Phase)
		}
		loss := m.Output("loss")
		require.Equal(t, "all_reduce", loss.Op)
		assert.Equal(t, "cross_entropy", loss.Args[0].Op)
		assert.Equal(t, pP, loss.Args[0].Place)
		i := slices.Index(m.Values, loss.Args[0])
		require.Less(t, i+1, len(m.Values))
		assert.Same(t, loss, m.Values[i+1], "the loss is reduced right after it is computed, so evaluation includes it")

		// Gradient reductions sit right after the value they reduce (a
		// run of reductions after one value counts as right after it).
		for i, v := range m.Values {
			if !isReduction(v) || v.Meta.Phase != ir.PhaseBwd {
				continue
			}
			j := i - 1
			for j >= 0 && isReduction(m.Values[j]) {
				j--
			}
			require.GreaterOrEqual(t, j, 0)
			assert.Same(t, v.Args[0], m.Values[j], "%s follows the gradient it reduces", v.Where())
			assert.Equal(t, pP, v.Args[0].Place, v.Where())
		}

		if zero == 3 {
			checkZero3Gathers(t, m)
		}
	})
}

// checkZero3Gathers: each param is gathered once per phase that reads it,
// right before its first user there, and only params are gathered.
func checkZero3Gathers(t *testing.T, m *ir.Module) {
	t.Helper()
	us := users(m)
	index := map[*ir.Value]int{}
	for i, v := range m.Values {
		index[v] = i
	}
	gathered := map[ir.Phase][]string{}
	for i, v := range m.Values {
		if v.Op != "all_gather" || v.Meta.Phase == ir.PhaseOpt {
			continue
		}
		p := v.Args[0]
		require.Equal(t, "param", p.Op, "ZeRO-3 gathers params only: %s", v.Where())
		gathered[v.Meta.Phase] = append(gathered[v.Meta.Phase], p.Name())
		require.NotEmpty(t, us[v], "%s has a user", v.Where())
		first := us[v][0]
		assert.Equal(t, v.Meta.Phase, first.Meta.Phase, "%s serves its own phase", v.Where())
		for _, u := range us[v] {
			assert.Equal(t, v.Meta.Phase, u.Meta.Phase, "%s is used in %s only", v.Where(), v.Meta.Phase)
		}
		for _, between := range m.Values[i+1 : index[first]] {
			assert.Contains(t, []string{"all_gather", "shard_slice"}, between.Op,
				"%s is gathered right before its first user %s, not before %s", v.Where(), first.Where(), between.Where())
		}
		// No op in the phase reads the sharded param itself.
		for _, u := range us[p] {
			if u.Meta.Phase == v.Meta.Phase {
				assert.Equal(t, "all_gather", u.Op, "%s reads the sharded param %s", u.Where(), p.Name())
			}
		}
	}
	for _, names := range gathered {
		sort.Strings(names)
		assert.Equal(t, slices.Compact(slices.Clone(names)), names, "a param is gathered once per phase")
	}
	assert.Len(t, gathered[ir.PhaseFwd], shardGPTParams, "every param is read in the forward")
	bwd := slices.Clone(gathered[ir.PhaseBwd])
	sort.Strings(bwd)
	assert.Equal(t, []string{
		"h.0.attn.c_attn.weight", "h.0.attn.c_proj.weight", "h.0.ln_1.weight", "h.0.ln_2.weight",
		"h.0.mlp.c_fc.weight", "h.0.mlp.c_proj.weight", "ln_f.weight", "wte.weight",
	}, bwd, "the backward reads the matrices and the LayerNorm γ")
}

// TestShardReducesEachGradientOnce: each param's gradient crosses the
// network once per step (all-reduce, or reduce-scatter under ZeRO, in
// the backward, bucketed), and the clipped gradient the optimizer reads is
// derived from that reduced gradient, not reduced a second time.
func TestShardReducesEachGradientOnce(t *testing.T) {
	forEachDP(t, func(t *testing.T, dp, zero int) {
		m, _ := compileDP(t, dp, zero, nil)
		want := map[int]map[string]int{
			0: {"all_reduce/fwd": 1, "all_reduce/bwd": 16},
			1: {"all_reduce/fwd": 1, "reduce_scatter/bwd": 16, "all_reduce/opt": 1, "shard_slice/opt": 16, "all_gather/opt": 16},
			2: {"all_reduce/fwd": 1, "reduce_scatter/bwd": 16, "all_reduce/opt": 1, "shard_slice/opt": 16, "all_gather/opt": 16},
			3: {"all_reduce/fwd": 1, "all_gather/fwd": 16, "all_gather/bwd": 8, "reduce_scatter/bwd": 16, "all_reduce/opt": 1},
		}[zero]
		if !assert.Equal(t, want, collectiveCounts(m)) {
			t.Logf("%s", ir.Print(m))
		}
		// Follow each optimizer input back to a backward reduction.
		var bad []string
		for _, v := range m.Values {
			if v.Op != "adam_m" && v.Op != "adam_v" {
				continue
			}
			g := v.Args[1]
			for g.Op == "scale" || g.Op == "shard_slice" {
				g = g.Args[0]
			}
			if !isReduction(g) || g.Meta.Phase != ir.PhaseBwd {
				bad = append(bad, fmt.Sprintf("%s reads %s (phase %s)", v.Where(), g.Where(), g.Meta.Phase))
			}
		}
		if len(bad) > 2 {
			bad = append(bad[:2], fmt.Sprintf("and %d more", len(bad)-2))
		}
		assert.Empty(t, bad, "optimizer ops must read the gradients reduced in the backward")
	})
}

func TestShardBuckets(t *testing.T) {
	t.Run("tiny buckets: one per reduction", func(t *testing.T) {
		forEachDP(t, func(t *testing.T, dp, zero int) {
			m, _ := compileDP(t, dp, zero, func(o *passes.Options) { o.BucketMB = 1e-9 })
			var buckets []int
			for _, v := range m.Values {
				if _, ok := v.Attrs["bucket"]; ok {
					buckets = append(buckets, v.Attrs.Int("bucket", -1))
				}
			}
			want := make([]int, shardGPTParams)
			for i := range want {
				want[i] = i
			}
			assert.Equal(t, want, buckets, "each gradient reduction in its own bucket, numbered in program order")
			checkBucketedOps(t, m)
		})
	})
	t.Run("default 25 MB: one bucket", func(t *testing.T) {
		forEachDP(t, func(t *testing.T, dp, zero int) {
			m, _ := compileDP(t, dp, zero, nil)
			n := 0
			for _, v := range m.Values {
				if _, ok := v.Attrs["bucket"]; ok {
					n++
					assert.Equal(t, 0, v.Attrs.Int("bucket", -1), v.Where())
				}
			}
			assert.Equal(t, shardGPTParams, n)
			checkBucketedOps(t, m)
		})
	})
	t.Run("greedy fill", func(t *testing.T) {
		// 20 KiB: wte's 32 KiB gradient gets a bucket of its own; the
		// others fill buckets in program order up to the limit.
		const limitMB = 20.0 / 1024
		limit := int64(limitMB * (1 << 20))
		forEachDP(t, func(t *testing.T, dp, zero int) {
			m, _ := compileDP(t, dp, zero, func(o *passes.Options) { o.BucketMB = limitMB })
			var sizes [][]int64 // bytes of each bucket's reductions
			for _, v := range m.Values {
				if _, ok := v.Attrs["bucket"]; !ok {
					continue
				}
				b := v.Attrs.Int("bucket", -1)
				require.True(t, b == len(sizes)-1 || b == len(sizes), "%s: bucket numbers rise by one in program order", v.Where())
				if b == len(sizes) {
					sizes = append(sizes, nil)
				}
				sizes[b] = append(sizes[b], v.Type.Bytes())
			}
			require.Greater(t, len(sizes), 1)
			sum := func(xs []int64) (s int64) {
				for _, x := range xs {
					s += x
				}
				return s
			}
			for i, b := range sizes {
				if len(b) > 1 {
					assert.LessOrEqual(t, sum(b), limit, "bucket %d holds %v", i, b)
				}
				if i+1 < len(sizes) {
					assert.Greater(t, sum(b)+sizes[i+1][0], limit, "bucket %d closed early: %v then %d", i, b, sizes[i+1][0])
				}
			}
			assert.Equal(t, []int64{256 * 32 * 4}, sizes[len(sizes)-1], "wte's gradient, last ready, alone")
		})
	})
	t.Run("disabled", func(t *testing.T) {
		m, res := compileDP(t, 2, 0, func(o *passes.Options) { o.Disable = []string{"data-parallel"} })
		assert.Equal(t, passes.Result{Name: "data-parallel", Skipped: "disabled"}, res[indexOf(t, res, "data-parallel")])
		assert.Equal(t, without(tableNames, "data-parallel"), m.Passes)
		for _, v := range m.Values {
			assert.NotContains(t, v.Attrs, "bucket", v.Where())
		}
		// A later run without the flag buckets what is left.
		res, err := passes.Run(m, shardOpts(2, 0), passes.Hooks{})
		require.NoError(t, err)
		dp := res[indexOf(t, res, "data-parallel")]
		assert.Empty(t, dp.Skipped)
		assert.True(t, dp.Changed)
		assert.Equal(t, tableNames, m.Passes)
	})
}

// checkBucketedOps: exactly the backward reductions over dp carry buckets.
func checkBucketedOps(t *testing.T, m *ir.Module) {
	t.Helper()
	for _, v := range m.Values {
		_, has := v.Attrs["bucket"]
		want := isReduction(v) && v.Attrs.Str("axis") == "dp" && v.Meta.Phase == ir.PhaseBwd
		assert.Equal(t, want, has, "bucket on %s (phase %s)", v.Where(), v.Meta.Phase)
	}
}

// TestShardRoundTrip: a compiled data-parallel module prints, parses back
// to the same text, verifies and resumes as finished.
func TestShardRoundTrip(t *testing.T) {
	forEachDP(t, func(t *testing.T, dp, zero int) {
		m, _ := compileDP(t, dp, zero, func(o *passes.Options) { o.BucketMB = 0.01 })
		text := ir.Print(m)
		assert.Contains(t, text, fmt.Sprintf("\nmesh dp=%d\n", dp))
		back, err := ir.Parse("dp.gir", text)
		require.NoError(t, err)
		require.Equal(t, text, ir.Print(back))
		require.NoError(t, ir.Verify(back, "data-parallel"))
		assert.Equal(t, m.NextID(), back.NextID())
		res, err := passes.Run(back, shardOpts(dp, zero), passes.Hooks{})
		require.NoError(t, err)
		for _, r := range res {
			assert.Equal(t, "already applied", r.Skipped, r.Name)
		}
		assert.Equal(t, text, ir.Print(back))
	})
	t.Run("stop after redistribute", func(t *testing.T) {
		// redistribute alone leaves no redistribute op; data-parallel only
		// adds bucket attributes.
		straight, _ := compileDP(t, 2, 2, nil)
		m := buildShardGPT(t, 8)
		o := shardOpts(2, 2)
		o.StopAfter = "redistribute"
		_, err := passes.Run(m, o, passes.Hooks{})
		require.NoError(t, err)
		assert.NotContains(t, ir.Print(m), " = redistribute ")
		assert.Equal(t, collectiveCounts(straight), collectiveCounts(m))
		assert.NotContains(t, ir.Print(m), "bucket=")
		assert.Equal(t, strings.Count(ir.Print(straight), "\n"), strings.Count(ir.Print(m), "\n"))
	})
	t.Run("resume after shard", func(t *testing.T) {
		// A dump taken between shard and redistribute (with redistribute
		// ops in it) finishes like a straight run.
		straight, _ := compileDP(t, 2, 3, nil)
		m := buildShardGPT(t, 8)
		o := shardOpts(2, 3)
		o.StopAfter = "shard"
		_, err := passes.Run(m, o, passes.Hooks{})
		require.NoError(t, err)
		text := ir.Print(m)
		assert.Contains(t, text, " = redistribute ")
		back, err := ir.Parse("shard.gir", text)
		require.NoError(t, err)
		require.Equal(t, text, ir.Print(back))
		// The mesh comes from the module now; the options name none.
		resume := passes.DefaultOptions()
		resume.Verify = true
		resume.Zero = 3
		_, err = passes.Run(back, resume, passes.Hooks{})
		require.NoError(t, err)
		assert.Equal(t, ir.Print(straight), ir.Print(back))
	})
}

// TestShardVerifierRejectsBrokenCollectives breaks one collective of a
// compiled module at a time.
func TestShardVerifierRejectsBrokenCollectives(t *testing.T) {
	cases := []struct {
		name  string
		zero  int
		op    string
		phase ir.Phase
		brk   func(v *ir.Value)
		want  string
	}{
		{"all_reduce result split", 0, "all_reduce", ir.PhaseBwd,
			func(v *ir.Value) { v.Place = []ir.Placement{{Kind: ir.Shard, Dim: 0}} }, "all_reduce on axis dp turns P into R, but the arg is P and the result S(0)"},
		{"all_reduce left partial", 0, "all_reduce", ir.PhaseBwd,
			func(v *ir.Value) { v.Place = []ir.Placement{{Kind: ir.Partial}} }, "the arg is P and the result P"},
		{"all_reduce on another axis", 0, "all_reduce", ir.PhaseBwd,
			func(v *ir.Value) { v.Attrs["axis"] = "tp" }, `axis "tp" is not in mesh dp=2`},
		{"reduce_scatter to R", 2, "reduce_scatter", ir.PhaseBwd,
			func(v *ir.Value) { v.Place = []ir.Placement{{Kind: ir.Replicate}} }, "reduce_scatter on axis dp turns P into S(0), but the arg is P and the result R"},
		{"all_gather of a whole param", 3, "all_gather", ir.PhaseFwd,
			func(v *ir.Value) { v.Args[0].Place = []ir.Placement{{Kind: ir.Replicate}} }, "all_gather on axis dp turns S(0) into R, but the arg is R and the result R"},
		{"shard_slice of a partial", 1, "shard_slice", ir.PhaseOpt,
			func(v *ir.Value) { v.Args[0].Place = []ir.Placement{{Kind: ir.Partial}} }, "shard_slice on axis dp turns R into S(0), but the arg is P"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m, _ := compileDP(t, 2, c.zero, nil)
			require.NoError(t, ir.Verify(m, "data-parallel"))
			var target *ir.Value
			for _, v := range m.Values {
				if v.Op == c.op && v.Meta.Phase == c.phase && v.Type.Rank() > 0 && (v.Op != "shard_slice" || v.Args[0].Op == "param") {
					target = v
					break
				}
			}
			require.NotNil(t, target, "no %s in phase %s", c.op, c.phase)
			c.brk(target)
			err := ir.Verify(m, "data-parallel")
			require.Error(t, err)
			var rules []string
			var found *ir.VerifyError
			for _, e := range unjoin(err) {
				var ve *ir.VerifyError
				require.ErrorAs(t, e, &ve)
				rules = append(rules, ve.Rule)
				if ve.Rule == ir.RuleCollective && found == nil {
					found = ve
				}
			}
			require.NotNil(t, found, "rules: %v (%v)", rules, err)
			assert.Same(t, target, found.Value)
			assert.Contains(t, found.Error(), `after pass "data-parallel": `+target.Where()+": ")
			assert.Contains(t, found.Error(), c.want)
		})
	}
}

func unjoin(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}

// maxOverBatch takes a max over the batch dim, which data parallelism
// splits: there is no max all-reduce yet. maxLine is the line of the Max.
var maxLine int

func maxOverBatch(b *frontend.Builder) {
	x := b.Input("x", ir.F32, 8, 4)
	w := b.Param("w", []int{4}, frontend.Normal(0.1), frontend.NoParallel)
	_, _, line, _ := runtime.Caller(0)
	h := x.Max(0) // the line right after the runtime.Caller
	maxLine = line + 1
	b.Loss(h.Mul(w).Sum())
}

// maxOverFeatures takes a max along a dim that stays whole on each device.
func maxOverFeatures(b *frontend.Builder) {
	x := b.Input("x", ir.F32, 8, 4)
	w := b.Param("w", []int{4, 4}, frontend.Normal(0.1), frontend.NoParallel)
	b.Loss(x.MatMul(w).Max(1).Sum())
}

func TestShardErrors(t *testing.T) {
	cases := []struct {
		name  string
		build func(t *testing.T) *ir.Module
		mesh  *ir.Mesh
		zero  int
		is    error
		wants []string
	}{
		{"batch not divisible by dp", func(t *testing.T) *ir.Module { return buildShardGPT(t, 8) }, dpMesh(3), 0, nil,
			[]string{`pass "shard"`, "input @model.go:29", `data parallelism splits "tokens" i32[8,16] along dim 0 over dp=3`}},
		{"ZeRO-3 param not divisible by dp", func(t *testing.T) *ir.Module { return buildShardGPT(t, 6) }, dpMesh(3), 3, nil,
			[]string{`pass "shard"`, "param @model.go:32", `ZeRO-3 splits "wte.weight" f32[256,32] over dp=3, but no dim is divisible by 3`}},
		{"ZeRO-1 gradient and state not divisible by dp", func(t *testing.T) *ir.Module { return buildShardGPT(t, 6) }, dpMesh(3), 1, nil,
			[]string{`pass "shard"`, "param @model.go:32", `ZeRO-1 splits "wte.weight" f32[256,32] over dp=3, but no dim is divisible by 3`}},
		{"batch not divisible by dp·ep", func(t *testing.T) *ir.Module { return buildShardGPT(t, 8) },
			&ir.Mesh{Axes: []ir.MeshAxis{{Name: "dp", Size: 2}, {Name: "ep", Size: 3}}}, 0, nil,
			[]string{`pass "shard"`, "input @model.go:29", `data and expert parallelism split "tokens" i32[8,16] along dim 0 over dp·ep = 6`}},
		{"a second data axis", func(t *testing.T) *ir.Module { return buildShardGPT(t, 8) },
			&ir.Mesh{Axes: []ir.MeshAxis{{Name: "dp", Size: 2}, {Name: "ep", Size: 2}, {Name: "ep", Size: 2}}}, 0, passes.ErrNotYet,
			[]string{`pass "shard"`, "mesh axis ep=2: only one data (dp), one expert (ep), one tensor (tp), one context (cp) and one pipeline (pp) axis are placed yet", "not yet supported"}},
		{"tp does not divide the vocab", func(t *testing.T) *ir.Module { return buildShardGPT(t, 8) },
			&ir.Mesh{Axes: []ir.MeshAxis{{Name: "tp", Size: 3}}}, 0, nil,
			[]string{`pass "shard"`, "param @model.go:32", `tensor parallelism tp=3 must divide dim 0 (256) of vocab-parallel "wte.weight" f32[256,32]`}},
		{"a layout on a vocab hint", func(t *testing.T) *ir.Module { return hinted(t, "vocab,out_in", 8, 4) }, tpMesh(2), 0, nil,
			[]string{`pass "shard"`, `parallel hint "vocab,out_in" does not fit param "w" f32[8,4]`}},
		{"an unknown layout", func(t *testing.T) *ir.Module { return hinted(t, "column,in_out", 8, 4) }, tpMesh(2), 0, nil,
			[]string{`parallel hint "column,in_out" does not fit param "w"`}},
		{"a bad block count", func(t *testing.T) *ir.Module { return hinted(t, "column:x", 8, 4) }, tpMesh(2), 0, nil,
			[]string{`parallel hint "column:x" of param "w": "x" is not a positive count`}},
		{"heads that do not tile the dim", func(t *testing.T) *ir.Module { return hinted(t, "heads:3,out_in", 8, 4) }, tpMesh(2), 0, nil,
			[]string{`param "w" f32[8,4]: dim 0 (8) is not a whole number of 3-wide heads`}},
		{"a position table of rows no multiple of seq under cp", func(t *testing.T) *ir.Module {
			m, err := frontend.Build(gpt.Model, frontend.Config{Name: "gpt", Batch: 4,
				Set: map[string]string{"layers": "1", "hidden": "32", "heads": "4", "seq": "16", "ctx": "40"}})
			require.NoError(t, err)
			return m
		}, &ir.Mesh{Axes: []ir.MeshAxis{{Name: "cp", Size: 2}}}, 0, nil,
			[]string{`pass "shard"`, "slice_grad @model.go:", "slice_grad puts the gradient of 16 rows, split over cp, back into 40 rows at 0: under that split the rows and the start must be multiples of 16 (a position table: its rows, ctx, a multiple of seq)"}},
		{"reduce_max over the batch", func(t *testing.T) *ir.Module {
			m, err := frontend.Build(maxOverBatch, frontend.Config{Name: "max", Batch: 8})
			require.NoError(t, err)
			return m
		}, dpMesh(2), 0, nil,
			[]string{`pass "shard"`, "reduce_max @shard_test.go:", "sharding on axis dp", "reduce_max over sharded dim 0"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := c.build(t)
			o := passes.DefaultOptions()
			o.Verify = true
			o.Mesh = c.mesh
			o.Zero = c.zero
			res, err := passes.Run(m, o, passes.Hooks{})
			require.Error(t, err)
			for _, w := range c.wants {
				assert.Contains(t, err.Error(), w)
			}
			if c.is != nil {
				assert.ErrorIs(t, err, c.is)
			} else {
				assert.NotErrorIs(t, err, passes.ErrNotYet, "a plan the user can fix is not a missing feature")
			}
			assert.NotContains(t, err.Error(), "panic")
			assert.Equal(t, "shard", res[len(res)-1].Name, "shard is the pass that fails")
			assert.Equal(t, passesBefore("shard"), m.Passes, "a failed shard is not recorded")
			// A plan error names the user's line: the model file, not the
			// compiler.
			if c.is == nil {
				assert.Regexp(t, regexp.MustCompile(`@(model|shard_test)\.go:\d+: `), err.Error())
			}
			assert.NotRegexp(t, regexp.MustCompile(`@(shard|shard_rules|pipeline)\.go:`), err.Error())
		})
	}
	t.Run("reduce_max names the line of the Max", func(t *testing.T) {
		m, err := frontend.Build(maxOverBatch, frontend.Config{Name: "max", Batch: 8})
		require.NoError(t, err)
		require.NotZero(t, maxLine)
		_, err = passes.Run(m, shardOpts(2, 0), passes.Hooks{})
		require.Error(t, err)
		assert.Contains(t, err.Error(), fmt.Sprintf("reduce_max @shard_test.go:%d: ", maxLine))
	})
	t.Run("dp=3 divides a batch of 6 and ZeRO-0 splits nothing else", func(t *testing.T) {
		m := buildShardGPT(t, 6)
		_, err := passes.Run(m, shardOpts(3, 0), passes.Hooks{})
		require.NoError(t, err)
	})
}

// TestShardReduceMaxOverFeatures: a max along a dim each device holds
// whole needs no communication, forward or backward.
func TestShardReduceMaxOverFeatures(t *testing.T) {
	m, err := frontend.Build(maxOverFeatures, frontend.Config{Name: "max", Batch: 8})
	require.NoError(t, err)
	_, err = passes.Run(m, shardOpts(2, 0), passes.Hooks{})
	require.NoError(t, err)
	for _, v := range m.Values {
		if v.Op == "reduce_max" || v.Op == "reduce_max_grad" {
			assert.Equal(t, pS0, v.Place, v.Where())
		}
	}
}

func tpMesh(n int) *ir.Mesh { return &ir.Mesh{Axes: []ir.MeshAxis{{Name: "tp", Size: n}}} }

// hinted is x·wᵀ with w [out,in] carrying the raw parallel hint (as a
// .gir file may).
func hinted(t *testing.T, hint string, out, in int) *ir.Module {
	m, err := frontend.Build(func(b *frontend.Builder) {
		x := b.Input("x", ir.F32, 4, in)
		w := b.Param("w", []int{out, in}, frontend.Normal(0.1), frontend.NoParallel)
		b.Loss(x.MatMulT(w).Sum())
	}, frontend.Config{Name: "hinted", Batch: 4})
	require.NoError(t, err)
	// Set after the build: the frontend refuses hints it cannot read,
	// which a hand-edited .gir can still carry to the pass.
	if hint != "" {
		m.Source("w").Attrs["parallel"] = hint
	}
	return m
}

// Hints on [out,in] weights: column-parallel splits rows (row-parallel
// splits columns: TestLlamaKVHeadsSplitOrReplicated checks o_proj); k/v
// heads split by whole heads when tp divides them, else stay whole on
// every tensor rank.
func TestShardOutInAndHeadHints(t *testing.T) {
	for _, c := range []struct {
		hint string
		tp   int
		want ir.Placement
	}{
		{"column,out_in", 2, ir.Placement{Kind: ir.Shard, Dim: 0}},
		{"heads:4,out_in", 2, ir.Placement{Kind: ir.Shard, Dim: 0}},
		{"heads:4,out_in", 4, ir.Placement{Kind: ir.Replicate}},
	} {
		t.Run(fmt.Sprintf("%s_tp%d", c.hint, c.tp), func(t *testing.T) {
			out, in := 8, 8
			m := hinted(t, c.hint, out, in)
			o := passes.DefaultOptions()
			o.Mesh = tpMesh(c.tp)
			_, err := passes.Run(m, o, passes.Hooks{})
			require.NoError(t, err)
			for _, p := range m.Params() {
				assert.Equal(t, c.want, p.Place[0], p.Name())
			}
		})
	}
}

// Under sequence parallelism a vocab-parallel table's gradient is made
// for the device's rows from dy gathered whole (b·s·h), as Megatron-LM's
// backward of its reduce-scatter to the sequence split does: no device
// holds a partial gradient of the whole table (V·h) to reduce-scatter.
// With microbatches and ZeRO too.
func TestSequenceParallelEmbeddingGradientIsVocabSplit(t *testing.T) {
	for _, tc := range []struct {
		name  string
		mesh  *ir.Mesh
		micro int
		zero  int
	}{
		{"tp2", tpMesh(2), 1, 0},
		{"dp2_tp2_micro2_zero1", &ir.Mesh{Axes: []ir.MeshAxis{{Name: "dp", Size: 2}, {Name: "tp", Size: 2}}}, 2, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := buildShardGPT(t, 8)
			o := passes.DefaultOptions()
			o.Verify = true
			o.Mesh = tc.mesh
			o.SequenceParallel = true
			o.Microbatches = tc.micro
			o.Zero = tc.zero
			_, err := passes.Run(m, o, passes.Hooks{})
			require.NoError(t, err)
			tp := tc.mesh.Axis("tp")
			grads := 0
			for _, v := range m.Values {
				if v.Op == "embedding_grad" && v.Type.Shape[0] == 256 {
					grads++
					assert.Equal(t, ir.Placement{Kind: ir.Shard, Dim: 0}, v.Place[tp], "%s: the device's rows", v.Where())
					assert.Equal(t, ir.Replicate, v.Args[1].Place[tp].Kind, "%s: from dy whole", v.Where())
				}
				if v.Op == "reduce_scatter" && v.Attrs.Str("axis") == "tp" {
					assert.NotEqual(t, 256, v.Type.Shape[0], "%s: a table's partial gradient reduce-scattered", v.Where())
				}
			}
			assert.Equal(t, tc.micro, grads)
		})
	}
}

// A value placed where an op has no rule for it names the params whose
// hints placed it: a row hint on a table added to the activations was
// reported only at the matmul, lines away; a softmax over the dim a
// column-parallel weight split, only at the softmax.
func TestNoRuleNamesTheHints(t *testing.T) {
	for _, tc := range []struct {
		name  string
		model frontend.ModelFunc
		want  []string
	}{
		{"a row-split table added to the activations", func(b *frontend.Builder) {
			x := b.Input("x", ir.F32, 4, 8)
			table := b.Param("table", []int{4, 8}, frontend.Normal(0.1), frontend.RowParallel)
			w := b.Param("w", []int{8, 6}, frontend.Normal(0.1), frontend.ColumnParallel)
			b.Loss(x.Add(table).MatMul(w).Sum())
		}, []string{"has no rule for operands placed S(0) (split on dim 0) and S(1) (split on dim 1) over tp", `"table"'s hint "row"`, `"w"'s hint "column"`}},
		{"a softmax over a column-parallel output", func(b *frontend.Builder) {
			x := b.Input("x", ir.F32, 4, 8)
			w := b.Param("w", []int{8, 6}, frontend.Normal(0.1), frontend.ColumnParallel)
			b.Loss(x.MatMul(w).Softmax().Sum())
		}, []string{"softmax normalises over dim 1, which is sharded", `"w"'s hint "column"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := frontend.Build(tc.model, frontend.Config{Name: "misused", Batch: 4})
			require.NoError(t, err)
			o := passes.DefaultOptions()
			o.Mesh = tpMesh(2)
			_, err = passes.Run(m, o, passes.Hooks{})
			require.Error(t, err)
			for _, want := range tc.want {
				assert.Contains(t, err.Error(), want)
			}
			assert.Regexp(t, `is placed by the parallel hints of .* \(shard_test\.go:\d+\)`, err.Error())
		})
	}
}
