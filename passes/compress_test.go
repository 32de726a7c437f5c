package passes_test

import (
	"fmt"

	"regexp"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/examples/gpt"
	"gcompile/frontend"
	"gcompile/ir"
	"gcompile/passes"
)

// reluGPT is the reference model with ReLU MLPs: batch 8 (per microbatch
// 8/micro), seq 16, hidden 32, so each MLP's pre-activation is
// f32[b,16,128] and its mask u8[b,16,16].
func reluGPT(t *testing.T, set map[string]string) *ir.Module {
	t.Helper()
	s := map[string]string{"layers": "2", "hidden": "32", "heads": "4", "seq": "16", "activation": "relu"}
	for k, v := range set {
		s[k] = v
	}
	m, err := frontend.Build(gpt.Model, frontend.Config{Name: "gpt", Batch: 8, Set: s})
	require.NoError(t, err)
	return m
}

// runTo runs the pipeline with the verifier on, through the named pass
// ("" for all of them).
func runTo(t *testing.T, m *ir.Module, stop string, set func(o *passes.Options)) error {
	t.Helper()
	opts := passes.DefaultOptions()
	opts.Verify = true
	opts.StopAfter = stop
	set(opts)
	_, err := passes.Run(m, opts, passes.Hooks{})
	return err
}

// The dump after compress holds a relu_mask right after every relu the
// backward differentiates (in the forward, or in the replay under full
// recompute), every relu_grad became a relu_grad_mask reading one, and no
// backward value reads a pre-activation any more. The checks run on the
// parsed dump, which must reprint to the same text.
func TestCompressReluDump(t *testing.T) {
	tests := []struct {
		name      string
		opts      func(o *passes.Options)
		phase     ir.Phase // where the masked relus run
		maskType  string
		gradType  string
		wantRelus int
	}{
		{"fwd", func(o *passes.Options) { o.Compress = "relu" }, ir.PhaseFwd, "u8[8,16,16]", "f32[8,16,128]", 2},
		{"micro2_selective", func(o *passes.Options) { o.Compress, o.Microbatches, o.Recompute = "relu", 2, "selective" },
			ir.PhaseFwd, "u8[4,16,16]", "f32[4,16,128]", 4},
		{"full_recompute_masks_the_replay", func(o *passes.Options) { o.Compress, o.Recompute = "relu", "full" }, ir.PhaseRecompute, "u8[8,16,16]", "f32[8,16,128]", 2},
		{"with_lowp", func(o *passes.Options) { o.Compress = "relu,lowp" }, ir.PhaseFwd, "u8[8,16,16]", "f32[8,16,128]", 2},
		{"bf16", func(o *passes.Options) { o.Compress, o.Precision = "relu", "bf16" }, ir.PhaseFwd, "u8[8,16,16]", "bf16[8,16,128]", 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := reluGPT(t, nil)
			require.NoError(t, runTo(t, m, "compress", tt.opts))
			dump := ir.Print(m)
			p, err := ir.Parse("compress.gir", dump)
			require.NoError(t, err)
			require.Equal(t, dump, ir.Print(p), "the dump round-trips")
			require.NoError(t, ir.Verify(p, "compress"))

			// CHECK lines on the text.
			assert.Regexp(t, `(?m)^%\d+ = relu_mask %\d+ : `+regexp.QuoteMeta(tt.maskType)+` \{[^}]*phase=`+tt.phase.String()+`[ }]`, dump)
			assert.Regexp(t, `(?m)^%\d+ = relu_grad_mask %\d+, %\d+ : `+regexp.QuoteMeta(tt.gradType)+` \{[^}]*phase=bwd[ }]`, dump)
			assert.NotRegexp(t, `(?m)^%\d+ = relu_grad `, dump, "no relu_grad reads a pre-activation")

			index := map[*ir.Value]int{}
			for i, v := range p.Values {
				index[v] = i
			}
			uses := p.Uses()
			var masks, grads int
			for _, v := range p.Values {
				switch v.Op {
				case "relu_mask":
					masks++
					x := v.Args[0]
					assert.Equal(t, tt.phase, v.Meta.Phase, "%s", v.Where())
					relu := slices.IndexFunc(uses[x], func(u *ir.Value) bool { return u.Op == "relu" && u.Meta.Phase == tt.phase })
					require.GreaterOrEqual(t, relu, 0, "%s: the masked value feeds a relu", v.Where())
					// Right after its relu; lowp's bf16 copy of the relu may sit between.
					r := uses[x][relu]
					require.Less(t, index[r], index[v], "%s comes after its relu", v.Where())
					for _, w := range p.Values[index[r]+1 : index[v]] {
						assert.True(t, w.Op == "cast" && w.Args[0] == r, "%s sits between %s and its mask %s", w.Where(), r.Where(), v.Where())
					}
					for _, u := range uses[x] {
						assert.Equal(t, x.Meta.Phase, u.Meta.Phase, "%s: the pre-activation %s is read by %s", v.Where(), x.Where(), u.Where())
					}
				case "relu_grad_mask":
					grads++
					assert.Equal(t, ir.PhaseBwd, v.Meta.Phase, "%s", v.Where())
					assert.Equal(t, "relu_mask", v.Args[0].Op, "%s reads a mask", v.Where())
				}
			}
			assert.Equal(t, tt.wantRelus, masks, "one mask per differentiated relu")
			assert.Equal(t, tt.wantRelus, grads)

			// The dump resumes: the rest of the pipeline gives what the
			// uninterrupted run gives.
			require.NoError(t, runTo(t, p, "", tt.opts))
			require.NoError(t, runTo(t, m, "", tt.opts))
			assert.Equal(t, ir.Print(m), ir.Print(p))
		})
	}
}

// A ReLU input that the backward reads elsewhere too stays stashed, so it
// gets no mask (a mask beside it would only add bytes); others still do.
// When no input can be dropped, the pass says which value and which
// reader keep it.
func TestCompressReluSkipsInputsTheBackwardKeeps(t *testing.T) {
	build := func(t *testing.T, withFree bool) (*ir.Module, *ir.Value, *ir.Value) {
		g := newGraph(t, 1)
		in := g.input("x", normal(1), 4, 8)
		x1 := g.op("matmul", nil, in, g.param("w1", normal(0.5), 8, 16))
		out := g.op("mul", nil, g.op("relu", nil, x1), x1) // mul's vjp reads x1
		var x2 *ir.Value
		if withFree {
			x2 = g.op("matmul", nil, in, g.param("w2", normal(0.5), 8, 16))
			out = g.op("add", nil, out, g.op("relu", nil, x2))
		}
		g.weightedLoss(out)
		return g.m, x1, x2
	}
	relu := func(o *passes.Options) { o.Compress = "relu" }

	m, x1, x2 := build(t, true)
	require.NoError(t, runTo(t, m, "compress", relu))
	var readers []string
	for _, u := range m.Uses()[x1] {
		readers = append(readers, u.Op+"/"+u.Meta.Phase.String())
	}
	assert.ElementsMatch(t, []string{"relu/fwd", "mul/fwd", "mul/bwd", "relu_grad/bwd"}, readers, "x1 keeps its relu_grad")
	for _, u := range m.Uses()[x2] {
		assert.Equal(t, ir.PhaseFwd, u.Meta.Phase, "x2 is read only in the forward, by %s", u.Where())
	}

	m, x1, _ = build(t, false)
	err := runTo(t, m, "compress", relu)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "--compress-activations relu: no ReLU input can leave the stash ("+x1.Where()+" is also read by ")
	assert.Contains(t, err.Error(), " mul @")
}

// Under tp a ReLU input's columns are split over the devices, and a mask
// packs them 8 to a byte: an input whose columns would not be whole bytes
// on each device stays stashed (shard could not split its mask), and the
// others are masked. When none can be, the error says why.
func TestCompressReluKeepsInputsTPCannotPack(t *testing.T) {
	build := func(t *testing.T, cols ...int) (*ir.Module, []*ir.Value) {
		g := newGraph(t, 1)
		in := g.input("x", normal(1), 4, 8)
		var out *ir.Value
		var xs []*ir.Value
		for i, c := range cols {
			x := g.op("matmul", nil, in, g.param(fmt.Sprintf("w%d", i), normal(0.5), 8, c))
			xs = append(xs, x)
			r := g.op("reduce_sum", ir.Attrs{"axes": []int{1}}, g.op("relu", nil, x))
			if out == nil {
				out = r
			} else {
				out = g.op("add", nil, out, r)
			}
		}
		g.weightedLoss(out)
		return g.m, xs
	}
	tp2 := func(o *passes.Options) {
		o.Compress = "relu"
		o.Mesh = &ir.Mesh{Axes: []ir.MeshAxis{{Name: "tp", Size: 2}}}
	}
	m, xs := build(t, 12, 16)
	require.NoError(t, runTo(t, m, "compress", tp2))
	masked := map[*ir.Value]bool{}
	for _, v := range m.Values {
		if v.Op == "relu_mask" {
			masked[v.Args[0]] = true
		}
	}
	assert.False(t, masked[xs[0]], "12 columns over tp=2 are 6 a device, not whole bytes")
	assert.True(t, masked[xs[1]], "16 columns over tp=2 are 8 a device")

	m, xs = build(t, 12)
	err := runTo(t, m, "compress", tp2)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "--compress-activations relu: no ReLU input can leave the stash ("+xs[0].Where()+" is "+xs[0].Type.String()+", whose last dim a mask packs 8 to a byte: split over tp=2 a device's 12/2 columns are not whole bytes (the dim must be a multiple of 16))")

	// One device packs any width.
	m, xs = build(t, 12)
	require.NoError(t, runTo(t, m, "compress", func(o *passes.Options) { o.Compress = "relu" }))
}

func TestCompressReluNeedsReLU(t *testing.T) {
	m := reluGPT(t, map[string]string{"activation": "gelu"})
	err := runTo(t, m, "compress", func(o *passes.Options) { o.Compress = "relu" })
	require.Error(t, err)
	assert.EqualError(t, err, `pass "compress": --compress-activations relu needs ReLU activations; model "gpt" has none (lowp works on any model; examples/gpt has ReLU with --set activation=relu)`)

	// lowp alone does not care.
	require.NoError(t, runTo(t, reluGPT(t, map[string]string{"activation": "gelu"}), "compress", func(o *passes.Options) { o.Compress = "lowp" }))
}

func TestCompressModes(t *testing.T) {
	tests := []struct {
		mode             string
		wantMask, wantLo bool
		err              bool
	}{
		{"", false, false, false},
		{"none", false, false, false},
		{"relu", true, false, false},
		{"lowp", false, true, false},
		{"relu,lowp", true, true, false},
		{"lowp,relu", true, true, false},
		{"zip", false, false, true},
		{"relu,relu", false, false, true},
		{"relu,", false, false, true},
		{"none,relu", false, false, true},
		{"RELU", false, false, true},
	}
	for _, tt := range tests {
		t.Run(tt.mode, func(t *testing.T) {
			m := reluGPT(t, nil)
			err := runTo(t, m, "compress", func(o *passes.Options) { o.Compress = tt.mode })
			if tt.err {
				require.Error(t, err)
				assert.Contains(t, err.Error(), `--compress-activations "`+tt.mode+`": want lowp, relu or both (relu,lowp)`)
				return
			}
			require.NoError(t, err)
			var masks, narrow int
			for _, v := range m.Values {
				switch {
				case v.Op == "relu_mask":
					masks++
				case v.Op == "cast" && v.Type.DType == ir.BF16:
					narrow++
				}
			}
			assert.Equal(t, tt.wantMask, masks > 0, "masks")
			assert.Equal(t, tt.wantLo, narrow > 0, "bf16 stashes")
			if tt.wantMask && tt.wantLo {
				// The pre-activation left the stash before lowp looked, so
				// only what the backward still reads is narrowed: no
				// pre-activation and no mask.
				for _, v := range m.Values {
					if v.Op == "cast" && v.Type.DType == ir.BF16 {
						assert.NotEqual(t, "relu_mask", v.Args[0].Op)
						for _, u := range m.Uses()[v.Args[0]] {
							assert.NotEqual(t, "relu_mask", u.Op, "%s narrows a masked pre-activation", v.Where())
						}
					}
				}
			}
		})
	}
}

// Placed on a mesh, the mask is split like its pre-activation (batch over
// dp, the 4h columns over tp), the gradient through it like the mask, and
// no collective ever moves packed bits.
func TestCompressReluSharding(t *testing.T) {
	for _, sp := range []bool{false, true} {
		m := reluGPT(t, nil)
		mesh := &ir.Mesh{Axes: []ir.MeshAxis{{Name: "dp", Size: 2}, {Name: "tp", Size: 2}}}
		require.NoError(t, runTo(t, m, "", func(o *passes.Options) { o.Compress, o.Mesh, o.SequenceParallel = "relu", mesh, sp }))
		want := []ir.Placement{{Kind: ir.Shard, Dim: 0}, {Kind: ir.Shard, Dim: 2}}
		masks := 0
		for _, v := range m.Values {
			switch {
			case v.Op == "relu_mask":
				masks++
				assert.True(t, ir.SamePlacement(want, v.Place), "%s placed %s", v.Where(), ir.PlacementString(v.Place))
				assert.True(t, ir.SamePlacement(v.Args[0].Place, v.Place), "%s: placed like x", v.Where())
				assert.Equal(t, ir.Shape{4, 16, 8}, ir.LocalShape(v.Type.Shape, v.Place, m.Mesh), "a device packs its own 64 columns")
			case v.Op == "relu_grad_mask":
				assert.True(t, ir.SamePlacement(want, v.Place), "%s placed %s", v.Where(), ir.PlacementString(v.Place))
				assert.True(t, ir.SamePlacement(v.Args[1].Place, v.Place), "%s: dy placed like the mask", v.Where())
			case len(v.Args) > 0 && v.Args[0].Type.DType == ir.U8:
				assert.Contains(t, []string{"relu_grad_mask"}, v.Op, "%s reads a mask", v.Where())
			}
		}
		assert.Equal(t, 2, masks, "sp=%v", sp)
	}
}

// A model whose ReLU inputs tp cannot split into whole bytes of mask is
// refused before placement, naming the value, the user's line and the
// rule: hidden 6 gives 4h = 24 columns, 12 per device over tp=2. (The
// shard pass refused the masks, with no way to keep the stash instead.)
func TestCompressReluSplitMustPackWholeBytes(t *testing.T) {
	m := reluGPT(t, map[string]string{"hidden": "6", "heads": "2", "seq": "4", "layers": "1"})
	mesh := &ir.Mesh{Axes: []ir.MeshAxis{{Name: "tp", Size: 2}}}
	err := runTo(t, m, "", func(o *passes.Options) { o.Compress, o.Mesh = "relu", mesh })
	require.Error(t, err)
	assert.Regexp(t, `pass "compress": --compress-activations relu: no ReLU input can leave the stash \(%\d+ add @\S*model\.go:\d+ is f32\[8,4,24\], whose last dim a mask packs 8 to a byte: split over tp=2 a device's 24/2 columns are not whole bytes \(the dim must be a multiple of 16\)\)`, err.Error())
}

// Under mixed precision the forward's stash is 16-bit already: lowp says
// how little is left for it to narrow, so a user does not expect fp32's
// halving; in fp32 it has nothing to say.
func TestCompressLowpNotesMixedPrecision(t *testing.T) {
	note := func(precision string) string {
		opts := passes.DefaultOptions()
		opts.StopAfter, opts.Compress, opts.Precision = "compress", "lowp", precision
		res, err := passes.Run(reluGPT(t, nil), opts, passes.Hooks{})
		require.NoError(t, err)
		i := slices.IndexFunc(res, func(r passes.Result) bool { return r.Name == "compress" })
		require.GreaterOrEqual(t, i, 0)
		return res[i].Note
	}
	assert.Empty(t, note(""))
	assert.Regexp(t, `^lowp: under --precision bf16 the stash is 16-bit already but for \d+ fp32 value\(s\), whose bf16 copies save \d+ bytes while stashed$`, note("bf16"))
}
