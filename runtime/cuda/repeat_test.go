package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/ir"
	kcpu "gcompile/kernels/cpu"
	"gcompile/lower"
	"gcompile/runtime/cpu"
)

// repeatText is a module of repeat_interleave along dim 1 (the k/v heads
// of [batch, heads, positions, head size]) and along the last dim, and,
// for a float dt, repeat_interleave_grad along dim 1, each result written
// to a state of the op's name. mesh and place, when not empty, split the
// module over a mesh: place is every value's placement.
func repeatText(dt, mesh, place string) string {
	var b strings.Builder
	b.WriteString("gir 1\nmodule \"repeat\"\n")
	if mesh != "" {
		b.WriteString("mesh " + mesh + "\n")
	}
	pl := ""
	if place != "" {
		pl = " place=[" + place + "]"
	}
	ty := func(dims string) string { return dt + "[" + dims + "]" }
	fmt.Fprintf(&b, "%%0 = state : %s {name=\"x\"%s}\n", ty("2,4,3,2"), pl)
	fmt.Fprintf(&b, "%%1 = state : %s {name=\"repeat_interleave\"%s}\n", ty("2,12,3,2"), pl)
	fmt.Fprintf(&b, "%%2 = state : %s {name=\"repeat_last\"%s}\n", ty("2,4,3,4"), pl)
	fmt.Fprintf(&b, "%%3 = repeat_interleave %%0 : %s {dim=1 repeats=3%s}\n", ty("2,12,3,2"), pl)
	fmt.Fprintf(&b, "%%4 = repeat_interleave %%0 : %s {dim=3 repeats=2%s}\n", ty("2,4,3,4"), pl)
	b.WriteString("update %1 = %3\nupdate %2 = %4\n")
	if dt != "i32" {
		fmt.Fprintf(&b, "%%5 = state : %s {name=\"dy\"%s}\n", ty("2,12,3,2"), pl)
		fmt.Fprintf(&b, "%%6 = state : %s {name=\"repeat_interleave_grad\"%s}\n", ty("2,4,3,2"), pl)
		fmt.Fprintf(&b, "%%7 = repeat_interleave_grad %%5 : %s {dim=1 repeats=3%s}\n", ty("2,4,3,2"), pl)
		b.WriteString("update %6 = %7\n")
	}
	return b.String()
}

func lowerRepeat(t *testing.T, dt, mesh, place string) *lower.Program {
	t.Helper()
	m, err := ir.Parse("repeat.gir", repeatText(dt, mesh, place))
	require.NoError(t, err)
	require.NoError(t, ir.Verify(m, ""))
	p, err := lower.Lower(m)
	require.NoError(t, err)
	return p
}

// host is what both backends' devices and clusters offer the test.
type host interface {
	SetFloat64s(name string, x []float64) error
	SetInt32(name string, x []int32) error
	Float64s(name string) ([]float64, error)
	Step() error
}

// repeatInputs writes the same x (and dy) to every host: for i32, ids up
// to 2³⁰, negative and NaN-like patterns; for floats, normal values over
// many binades, so an inexact move or a sum in another order would show.
func repeatInputs(t *testing.T, dt string, hs ...host) (x, dy []float64) {
	t.Helper()
	r := rand.New(rand.NewPCG(3, 9))
	const nx, ndy = 2 * 4 * 3 * 2, 2 * 12 * 3 * 2
	if dt == "i32" {
		ids := make([]int32, nx)
		for i := range ids {
			ids[i] = int32(r.Uint32())
		}
		ids[0], ids[1], ids[2] = -1, 0x7fc00001, 1<<30
		for _, h := range hs {
			require.NoError(t, h.SetInt32("x", ids))
		}
		for _, id := range ids {
			x = append(x, float64(id))
		}
		return x, nil
	}
	draw := func(n int) []float64 {
		v := make([]float64, n)
		for i := range v {
			v[i] = r.NormFloat64() * math.Ldexp(1, r.IntN(30)-15)
		}
		return v
	}
	x, dy = draw(nx), draw(ndy)
	for _, h := range hs {
		require.NoError(t, h.SetFloat64s("x", x))
		require.NoError(t, h.SetFloat64s("dy", dy))
	}
	return x, dy
}

// requireSameBits checks every result against the CPU backend's, bit for
// bit (as float64s: each dtype widens exactly).
func requireSameBits(t *testing.T, names []string, ref, got host) {
	t.Helper()
	for _, name := range names {
		want, err := ref.Float64s(name)
		require.NoError(t, err)
		g, err := got.Float64s(name)
		require.NoError(t, err)
		require.Len(t, g, len(want), name)
		require.NotEqual(t, make([]float64, len(want)), want, "%s: the CPU computed nothing", name)
		for i := range want {
			require.Equal(t, math.Float64bits(want[i]), math.Float64bits(g[i]), "%s[%d]: %v, the CPU's %v", name, i, g[i], want[i])
		}
	}
}

func repeatNames(dt string) []string {
	if dt == "i32" {
		return []string{"repeat_interleave", "repeat_last"}
	}
	return []string{"repeat_interleave", "repeat_last", "repeat_interleave_grad"}
}

// repeat_interleave and its gradient run on the backend as on the CPU's,
// to the bit: the move copies f32 and i32 elements (i32 through the fp32
// kernel as bits) and 16-bit ones through the fp32 emulation, whose
// widening and rounding back are exact for a value that was a bf16; the
// gradient sums in the CPU's order in double. The results are also the
// reference kernels' on the inputs.
func TestRepeatInterleaveMatchesCPU(t *testing.T) {
	rt := openTest(t)
	for _, dt := range []string{"f32", "bf16", "i32"} {
		t.Run(dt, func(t *testing.T) {
			p := lowerRepeat(t, dt, "", "")
			plan, _, err := Plan([]*lower.Program{p}, 0)
			require.NoError(t, err)
			seen := map[string]bool{}
			for _, ip := range plan {
				assert.Empty(t, strayKernels(ip), "%s launches kernels the kernel table does not give it", ip.Op)
				seen[ip.Op] = true
				if ip.Op == "repeat_interleave" {
					assert.Contains(t, strings.Join(ip.Steps, " "), "gc_repeat_interleave<<<")
				}
				if ip.Op == "repeat_interleave_grad" {
					assert.Contains(t, strings.Join(ip.Steps, " "), "gc_repeat_interleave_grad<<<")
				}
			}
			assert.True(t, seen["repeat_interleave"])
			assert.Equal(t, dt != "i32", seen["repeat_interleave_grad"])

			ref, err := cpu.Load(p, cpu.Options{})
			require.NoError(t, err)
			d, err := Load(rt, p, Options{})
			require.NoError(t, err)
			t.Cleanup(func() { assert.NoError(t, d.Close()) })
			x, dy := repeatInputs(t, dt, ref, d)
			require.NoError(t, ref.Step())
			require.NoError(t, d.Step())
			requireSameBits(t, repeatNames(dt), ref, d)

			if dt != "f32" {
				return
			}
			x32, dy32 := narrowF32(x), narrowF32(dy)
			want := make([]float32, 3*len(x32))
			kcpu.RepeatInterleave(want, x32, 2, 4, 3*2, 3)
			requireF32(t, d, "repeat_interleave", want)
			want = make([]float32, 2*len(x32))
			kcpu.RepeatInterleave(want, x32, 2*4*3, 2, 1, 2)
			requireF32(t, d, "repeat_last", want)
			want = make([]float32, len(x32))
			kcpu.RepeatInterleaveGrad(want, dy32, 2, 4, 3*2, 3)
			requireF32(t, d, "repeat_interleave_grad", want)
		})
	}
}

// Under tensor parallelism each device repeats the slices it holds: split
// along the repeated dim (S(1), the k/v heads split over tp) its local n
// is half the global one, split elsewhere (S(0)) n is whole. Either way
// the assembled results are the CPU cluster's and the whole-tensor
// reference kernels', to the bit.
func TestRepeatInterleaveLocalShapes(t *testing.T) {
	rt := openTest(t)
	for _, place := range []string{"S(1)", "S(0)"} {
		t.Run(place, func(t *testing.T) {
			p := lowerRepeat(t, "f32", "tp=2", place)
			local := 0
			for _, in := range p.Instrs {
				if strings.HasPrefix(in.Op, "repeat_interleave") {
					split := map[string]int{"S(1)": 1, "S(0)": 0}[place]
					assert.Equal(t, in.Value.Args[0].Type.Shape[split]/2, in.ArgTypes[0].Shape[split], "%s has local shapes", in.Op)
					local++
				}
			}
			require.Equal(t, 3, local, "two repeats and a gradient")
			ref, err := cpu.NewCluster(p, cpu.Options{})
			require.NoError(t, err)
			cl, err := NewCluster(rt, p, Options{})
			require.NoError(t, err)
			t.Cleanup(func() { assert.NoError(t, cl.Close()) })
			x, dy := repeatInputs(t, "f32", globalHost{ref}, globalHost{cl})
			require.NoError(t, ref.Step())
			require.NoError(t, cl.Step())
			requireSameBits(t, repeatNames("f32"), globalHost{ref}, globalHost{cl})

			x32, dy32 := narrowF32(x), narrowF32(dy)
			want := make([]float32, 3*len(x32))
			kcpu.RepeatInterleave(want, x32, 2, 4, 3*2, 3)
			requireF32(t, globalHost{cl}, "repeat_interleave", want)
			want = make([]float32, len(x32))
			kcpu.RepeatInterleaveGrad(want, dy32, 2, 4, 3*2, 3)
			requireF32(t, globalHost{cl}, "repeat_interleave_grad", want)
		})
	}
}

// globalHost reads and writes whole tensors of a cluster.
type globalHost struct {
	c interface {
		SetGlobal(name string, x []float64) error
		SetInt32(name string, x []int32) error
		Global(name string) ([]float64, error)
		Step() error
	}
}

func (g globalHost) SetFloat64s(name string, x []float64) error { return g.c.SetGlobal(name, x) }
func (g globalHost) SetInt32(name string, x []int32) error      { return g.c.SetInt32(name, x) }
func (g globalHost) Float64s(name string) ([]float64, error)    { return g.c.Global(name) }
func (g globalHost) Step() error                                { return g.c.Step() }

func narrowF32(x []float64) []float32 {
	out := make([]float32, len(x))
	for i, v := range x {
		out[i] = float32(v)
	}
	return out
}

// requireF32 checks result name against want bit for bit.
func requireF32(t *testing.T, h host, name string, want []float32) {
	t.Helper()
	got, err := h.Float64s(name)
	require.NoError(t, err)
	require.Len(t, got, len(want), name)
	for i := range want {
		require.Equal(t, math.Float32bits(want[i]), math.Float32bits(float32(got[i])), "%s[%d]", name, i)
	}
}

// A lowered instruction whose local shapes are not repeats of each other
// is refused at load, not launched to read out of bounds.
func TestRepeatInterleaveRefusesMismatchedShapes(t *testing.T) {
	p := lowerRepeat(t, "f32", "", "")
	for _, op := range []string{"repeat_interleave", "repeat_interleave_grad"} {
		q := *p
		q.Instrs = append([]lower.Instr(nil), p.Instrs...)
		for i, in := range q.Instrs {
			if in.Op == op {
				in.Attrs = in.Attrs.Clone()
				in.Attrs["repeats"] = 2
				q.Instrs[i] = in
				break
			}
		}
		_, _, err := Plan([]*lower.Program{&q}, 0)
		require.Error(t, err, op)
		assert.Contains(t, err.Error(), "are not 2 repeats along dim 1", op)
	}
}
