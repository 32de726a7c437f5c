package passes_test

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/frontend"
	"gcompile/ir"
	"gcompile/lower"
	"gcompile/passes"
	"gcompile/runtime/cpu"
)

// optModel is small but has params of rank 2 and 3 (decayed) and of rank 1
// and 0 (not decayed), and gradients large enough for clipping at 1 to act.
func optModel(b *frontend.Builder) {
	x := b.Input("x", ir.F64, 2, 3)
	w := b.Param("w", []int{3, 4}, frontend.Normal(0.7), frontend.NoParallel)
	bias := b.Param("b", []int{4}, frontend.Normal(0.7), frontend.NoParallel)
	k := b.Param("k", []int{2, 2, 2}, frontend.Normal(0.7), frontend.NoParallel)
	s := b.Param("s", []int{}, frontend.Normal(0.7), frontend.NoParallel)
	h := x.MatMul(w).Add(bias).Tanh().Reshape(2, 2, 2).Mul(k)
	b.Loss(h.Sum().Mul(s).Add(h.Mul(h).Mean()))
}

var optParams = []string{"w", "b", "k", "s"}

func buildOptModel(t *testing.T) *ir.Module {
	m, err := frontend.Build(optModel, frontend.Config{Name: "opt", Float: ir.F64})
	require.NoError(t, err)
	return m
}

func loadDevice(t *testing.T, m *ir.Module) *cpu.Device {
	prog, err := lower.Lower(m)
	require.NoError(t, err)
	dev, err := cpu.Load(prog, cpu.Options{})
	require.NoError(t, err)
	return dev
}

// refOptimizer is a float64 transcription of PyTorch's
// clip_grad_norm_(max_norm) followed by AdamW or SGD(momentum, dampening=0),
// with weight decay only on params of rank ≥ 2.
type refOptimizer struct {
	o      *passes.Options
	params map[string][]float64
	rank   map[string]int
	m, v   map[string][]float64 // Adam moments
	buf    map[string][]float64 // SGD momentum buffers
}

func newRefOptimizer(o *passes.Options, params map[string][]float64, rank map[string]int) *refOptimizer {
	r := &refOptimizer{o: o, params: params, rank: rank, m: map[string][]float64{}, v: map[string][]float64{}, buf: map[string][]float64{}}
	for name, p := range params {
		r.m[name] = make([]float64, len(p))
		r.v[name] = make([]float64, len(p))
		r.buf[name] = make([]float64, len(p))
	}
	return r
}

// step applies one update with the given gradients and returns the global
// gradient norm before clipping.
func (r *refOptimizer) step(grads map[string][]float64, lr float64, t int) float64 {
	sumsq := 0.0
	for _, g := range grads {
		for _, x := range g {
			sumsq += x * x
		}
	}
	norm := math.Sqrt(sumsq)
	coef := 1.0
	if r.o.ClipNorm > 0 {
		coef = math.Min(1, r.o.ClipNorm/(norm+1e-6))
	}
	for name, p := range r.params {
		wd := 0.0
		if r.rank[name] >= 2 {
			wd = r.o.WeightDecay
		}
		for i := range p {
			g := grads[name][i] * coef
			switch r.o.Optimizer {
			case "adamw":
				// torch.optim.AdamW (single-tensor, amsgrad=False).
				p[i] *= 1 - lr*wd
				r.m[name][i] = r.o.Beta1*r.m[name][i] + (1-r.o.Beta1)*g
				r.v[name][i] = r.o.Beta2*r.v[name][i] + (1-r.o.Beta2)*g*g
				bc1 := 1 - math.Pow(r.o.Beta1, float64(t))
				bc2 := 1 - math.Pow(r.o.Beta2, float64(t))
				denom := math.Sqrt(r.v[name][i])/math.Sqrt(bc2) + r.o.Eps
				p[i] -= lr / bc1 * r.m[name][i] / denom
			case "sgd":
				// torch.optim.SGD: d = g + wd·p; buf = μ·buf + d (buf = d on
				// the first step, which a zero buffer reproduces); p -= lr·buf.
				d := g + wd*p[i]
				r.buf[name][i] = r.o.Momentum*r.buf[name][i] + d
				p[i] -= lr * r.buf[name][i]
			}
		}
	}
	return norm
}

// assertClose compares element by element with |want − got| ≤ tol·(1+|want|).
func assertClose(t *testing.T, want, got []float64, tol float64, what string) {
	t.Helper()
	require.Len(t, got, len(want), what)
	for i := range want {
		assert.LessOrEqualf(t, math.Abs(want[i]-got[i]), tol*(1+math.Abs(want[i])), "%s[%d]: want %.15g, got %.15g", what, i, want[i], got[i])
	}
}

func TestOptimizerMatchesReference(t *testing.T) {
	cases := []struct {
		name string
		set  func(o *passes.Options)
		// clips says whether the first step's norm exceeds ClipNorm, so
		// each case provably exercises (or skips) clipping.
		clips bool
	}{
		{"adamw/defaults", func(o *passes.Options) {}, true},
		{"adamw/no-clip", func(o *passes.Options) {
			o.ClipNorm, o.WeightDecay, o.Beta1, o.Beta2 = 0, 0.5, 0.8, 0.99
		}, false},
		{"adamw/clip-inactive", func(o *passes.Options) { o.ClipNorm = 1e3 }, false},
		{"adamw/tight-clip-large-eps", func(o *passes.Options) { o.ClipNorm, o.Eps = 0.05, 1e-2 }, true},
		{"sgd/momentum", func(o *passes.Options) { o.Optimizer = "sgd" }, true},
		{"sgd/plain", func(o *passes.Options) {
			o.Optimizer, o.Momentum, o.WeightDecay, o.ClipNorm = "sgd", 0, 0, 0
		}, false},
		{"sgd/strong-decay-tight-clip", func(o *passes.Options) {
			o.Optimizer, o.Momentum, o.WeightDecay, o.ClipNorm = "sgd", 0.5, 0.3, 0.1
		}, true},
	}
	lrs := []float64{0.1, 0.05, 0.02}
	for ci, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			opts := passes.DefaultOptions()
			opts.Verify = true
			c.set(opts)

			full := buildOptModel(t)
			_, err := passes.Run(full, opts, passes.Hooks{})
			require.NoError(t, err)
			gradOpts := *opts
			gradOpts.StopAfter = "autodiff"
			grad := buildOptModel(t)
			_, err = passes.Run(grad, &gradOpts, passes.Hooks{})
			require.NoError(t, err)

			dev, gdev := loadDevice(t, full), loadDevice(t, grad)
			require.NoError(t, dev.InitParams(uint64(ci+1)))
			rng := rand.New(rand.NewPCG(uint64(ci), 99))
			x := normal(1)(rng, 6)
			require.NoError(t, dev.SetFloat64s("x", x))
			require.NoError(t, gdev.SetFloat64s("x", x))

			params := map[string][]float64{}
			initial := map[string][]float64{}
			rank := map[string]int{}
			for _, name := range optParams {
				p, err := dev.Float64s(name)
				require.NoError(t, err)
				params[name] = p
				initial[name] = slices.Clone(p)
				rank[name] = full.Source(name).Type.Rank()
			}
			ref := newRefOptimizer(opts, params, rank)

			for step := 1; step <= len(lrs); step++ {
				lr := lrs[step-1]
				// Gradients at the reference params from the autodiff-only module.
				for _, name := range optParams {
					require.NoError(t, gdev.SetFloat64s(name, ref.params[name]))
				}
				require.NoError(t, gdev.Step())
				wantLoss, err := gdev.Scalar("loss")
				require.NoError(t, err)
				grads := map[string][]float64{}
				for _, name := range optParams {
					grads[name], err = gdev.Float64s(passes.GradPrefix + name)
					require.NoError(t, err)
				}

				require.NoError(t, dev.SetScalar(passes.InputLR, lr))
				require.NoError(t, dev.SetScalar(passes.InputStep, float64(step)))
				require.NoError(t, dev.Step())
				loss, err := dev.Scalar("loss")
				require.NoError(t, err)
				gotNorm, err := dev.Scalar(passes.OutputGradNrm)
				require.NoError(t, err)

				wantNorm := ref.step(grads, lr, step)
				if step == 1 && opts.ClipNorm > 0 {
					assert.Equal(t, c.clips, wantNorm > opts.ClipNorm, "norm %g vs clip %g", wantNorm, opts.ClipNorm)
				}
				assert.InDelta(t, wantLoss, loss, 1e-12*(1+math.Abs(wantLoss)), "step %d loss", step)
				assert.InDelta(t, wantNorm, gotNorm, 1e-12*(1+wantNorm), "step %d grad_norm", step)

				for _, name := range optParams {
					got, err := dev.Float64s(name)
					require.NoError(t, err)
					assertClose(t, ref.params[name], got, 1e-10, name)
					states := map[string][]float64{"adam.m/": ref.m[name], "adam.v/": ref.v[name]}
					absent := "sgd.momentum/"
					if opts.Optimizer == "sgd" {
						states = map[string][]float64{"sgd.momentum/": ref.buf[name]}
						absent = "adam.m/"
					}
					for prefix, want := range states {
						got, err := dev.Float64s(prefix + name)
						require.NoError(t, err)
						assertClose(t, want, got, 1e-10, prefix+name)
					}
					_, err = dev.Float64s(absent + name)
					assert.Error(t, err, "%s optimizer has no %s state", opts.Optimizer, absent)
				}
			}
			// The params moved: the comparison is not of untouched values.
			for _, name := range optParams {
				assert.NotEqual(t, initial[name], ref.params[name], name)
			}
		})
	}
}

// TestOptimizerModule checks the IR the optimizer pass leaves behind.
func TestOptimizerModule(t *testing.T) {
	for _, optName := range []string{"adamw", "sgd"} {
		t.Run(optName, func(t *testing.T) {
			opts := passes.DefaultOptions()
			opts.Optimizer = optName
			opts.Verify = true
			m := buildOptModel(t)
			_, err := passes.Run(m, opts, passes.Hooks{})
			require.NoError(t, err)

			var outs []string
			for _, o := range m.Outputs {
				outs = append(outs, o.Name)
			}
			assert.ElementsMatch(t, []string{"loss", passes.OutputGradNrm}, outs, "gradient outputs are consumed")

			lr, step := m.Source(passes.InputLR), m.Source(passes.InputStep)
			require.NotNil(t, lr)
			require.NotNil(t, step)
			assert.Equal(t, "input", lr.Op)
			assert.True(t, lr.Type.Equal(ir.T(ir.F64)), "lr is %v", lr.Type)
			assert.True(t, step.Type.Equal(ir.T(ir.I64)), "step is %v", step.Type)

			updated := map[string]*ir.Value{}
			for _, u := range m.Updates {
				updated[u.State.Name()] = u.Value
			}
			stateNames := []string{"adam.m/", "adam.v/"}
			updateOp := "adamw"
			if optName == "sgd" {
				stateNames = []string{"sgd.momentum/"}
				updateOp = "sgd"
			}
			assert.Len(t, m.Updates, len(optParams)*(1+len(stateNames)))
			for _, name := range optParams {
				p := m.Source(name)
				require.Contains(t, updated, name)
				assert.Equal(t, updateOp, updated[name].Op)
				assert.Equal(t, ir.PhaseOpt, updated[name].Meta.Phase)
				for _, prefix := range stateNames {
					st := m.Source(prefix + name)
					require.NotNil(t, st, prefix+name)
					assert.Equal(t, "state", st.Op)
					assert.Equal(t, "zeros", st.Attrs.Str("init"))
					assert.True(t, st.Type.Equal(p.Type))
					assert.Contains(t, updated, prefix+name)
				}
				// Weight decay only on matrices and higher.
				decayed := updated[name]
				if optName == "sgd" {
					decayed = updated["sgd.momentum/"+name]
				}
				wantWD := 0.0
				if p.Type.Rank() >= 2 {
					wantWD = opts.WeightDecay
				}
				assert.Equal(t, wantWD, decayed.Attrs.Float("wd", -1), "wd of %s (rank %d)", name, p.Type.Rank())
			}
		})
	}
}

func TestOptimizerRejectsStepZero(t *testing.T) {
	m := buildOptModel(t)
	_, err := passes.Run(m, passes.DefaultOptions(), passes.Hooks{})
	require.NoError(t, err)
	dev := loadDevice(t, m)
	require.NoError(t, dev.InitParams(1))
	require.NoError(t, dev.SetScalar(passes.InputLR, 0.1))
	require.NoError(t, dev.SetScalar(passes.InputStep, 0))
	err = dev.Step()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "step must be ≥ 1")
}

func TestOptimizerErrors(t *testing.T) {
	cases := []struct {
		name  string
		build func(t *testing.T) *ir.Module
		want  string
	}{
		{"reserved input name", func(t *testing.T) *ir.Module {
			m, err := frontend.Build(func(b *frontend.Builder) {
				lr := b.Input(passes.InputLR, ir.F64)
				w := b.Param("w", []int{2}, frontend.Normal(1), frontend.NoParallel)
				b.Loss(w.Sum().Mul(lr))
			}, frontend.Config{Name: "reserved", Float: ir.F64})
			require.NoError(t, err)
			return m
		}, `name "lr" is reserved for the optimizer`},
		{"missing gradient", func(t *testing.T) *ir.Module {
			// A module that claims autodiff ran but lost a gradient output.
			m := buildOptModel(t)
			opts := passes.DefaultOptions()
			opts.StopAfter = "autodiff"
			_, err := passes.Run(m, opts, passes.Hooks{})
			require.NoError(t, err)
			kept := m.Outputs[:0]
			for _, o := range m.Outputs {
				if o.Name != passes.GradPrefix+"k" {
					kept = append(kept, o)
				}
			}
			m.Outputs = kept
			return m
		}, `no gradient output "grad/k"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := c.build(t)
			res, err := passes.Run(m, passes.DefaultOptions(), passes.Hooks{})
			require.Error(t, err)
			assert.Contains(t, err.Error(), c.want)
			assert.Contains(t, err.Error(), `pass "optimizer"`)
			require.NotEmpty(t, res)
			assert.Equal(t, "optimizer", res[len(res)-1].Name)
			assert.False(t, m.HasRun("optimizer"))
		})
	}
}

// TestMemoryEfficientOptimizerModule checks the IR Adafactor and SM3
// leave behind: factored row/column state for matrices, full state for
// the other ranks, and which old or new values each update reads.
func TestMemoryEfficientOptimizerModule(t *testing.T) {
	for _, optName := range []string{"adafactor", "sm3"} {
		t.Run(optName, func(t *testing.T) {
			opts := passes.DefaultOptions()
			opts.Optimizer = optName
			opts.Verify = true
			require.NoError(t, opts.Validate())
			m := buildOptModel(t)
			_, err := passes.Run(m, opts, passes.Hooks{})
			require.NoError(t, err)

			updated := map[string]*ir.Value{}
			for _, u := range m.Updates {
				updated[u.State.Name()] = u.Value
			}
			// w is the only matrix: row and col; b, k and s keep v.
			assert.Len(t, m.Updates, 3+3*2)
			w := m.Source("w")
			row, col := m.Source(optName+".row:w"), m.Source(optName+".col:w")
			require.NotNil(t, row)
			require.NotNil(t, col)
			assert.True(t, row.Type.Equal(ir.T(ir.F64, 3)), "row state %v", row.Type)
			assert.True(t, col.Type.Equal(ir.T(ir.F64, 4)), "col state %v", col.Type)
			assert.Nil(t, m.Source(optName+".v/w"), "a matrix has no full second moment")
			for _, name := range []string{"b", "k", "s"} {
				v := m.Source(optName + ".v/" + name)
				require.NotNil(t, v, name)
				assert.True(t, v.Type.Equal(m.Source(name).Type))
				assert.Contains(t, updated, optName+".v/"+name)
				assert.Equal(t, optName+"_vec", updated[name].Op)
				assert.Same(t, updated[optName+".v/"+name], updated[name].Args[2], "%s steps with the new accumulator", name)
			}
			pw := updated["w"]
			assert.Equal(t, optName, pw.Op)
			assert.Same(t, w, pw.Args[0])
			assert.Equal(t, optName+"_row", updated[row.Name()].Op)
			assert.Equal(t, optName+"_col", updated[col.Name()].Op)
			for _, v := range m.Values {
				if v.Meta.Phase == ir.PhaseOpt && v.Op != "input" {
					assert.NotContains(t, v.Attrs, "wd", "%s: neither paper decays weights", v.Where())
				}
			}
			switch optName {
			case "adafactor":
				// The new accumulators feed the update; the step size is
				// relative, so nothing reads the learning rate.
				assert.Same(t, updated[row.Name()], pw.Args[2])
				assert.Same(t, updated[col.Name()], pw.Args[3])
				assert.Same(t, m.Source(passes.InputStep), pw.Args[4])
				assert.Equal(t, 1e-30, updated[row.Name()].Attrs.Float("eps1", 0))
				assert.Equal(t, 0.8, updated[row.Name()].Attrs.Float("decay", 0))
				assert.Equal(t, map[string]float64{"eps2": 1e-3, "clip": 1, "rel_step": 1e-2},
					map[string]float64{"eps2": pw.Attrs.Float("eps2", 0), "clip": pw.Attrs.Float("clip", 0), "rel_step": pw.Attrs.Float("rel_step", 0)})
				lr := m.Source(passes.InputLR)
				for _, v := range m.Values {
					assert.NotContains(t, v.Args, lr, "%s reads the learning rate", v.Where())
				}
			case "sm3":
				// SM3-II: ν comes from the previous accumulators, so the
				// update reads the old state, not the new maxima.
				assert.Same(t, row, pw.Args[2])
				assert.Same(t, col, pw.Args[3])
				assert.Same(t, m.Source(passes.InputLR), pw.Args[4])
			}
		})
	}
}
