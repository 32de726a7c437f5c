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
	"gcompile/lower"
	"gcompile/runtime/cpu"
)

// randomDTypes are the result dtypes the random ops are run in: f32 (the
// default, given by no dtype attribute) and the 16-bit formats, which
// draw in fp32 scratch and round back as the CPU does.
var randomDTypes = []string{"f32", "bf16", "f16"}

// randomText is a module of the random op, every dist in every dtype, and
// normal_cdf, each result written to a state of its name: key i32[4,3]
// (state "key"), draws over dims [5] (uniform), [2,70] (normal: 140 per
// key, more than a warp) and [7] (dropout, p = 0.3), streams 2, −3 and 1,
// one uniform without dims, and Φ of the states x_<dtype>. mesh and
// place, when not empty, split the module over a mesh: place is every
// value's placement.
func randomText(mesh, place string) string {
	var b strings.Builder
	b.WriteString("gir 1\nmodule \"random\"\n")
	if mesh != "" {
		b.WriteString("mesh " + mesh + "\n")
	}
	pl := ""
	if place != "" {
		pl = " place=[" + place + "]"
	}
	n := 0
	val := func(format string, a ...any) string {
		id := fmt.Sprintf("%%%d", n)
		n++
		fmt.Fprintf(&b, "%s = "+format+"\n", append([]any{id}, a...)...)
		return id
	}
	state := func(name, t string) string { return val("state : %s {name=%q%s}", t, name, pl) }
	result := func(name, t, op, attrs string) {
		s := state(name, t)
		v := val("%s : %s {%s%s}", op, t, attrs, pl)
		fmt.Fprintf(&b, "update %s = %s\n", s, v)
	}
	key := state("key", "i32[4,3]")
	for _, dt := range randomDTypes {
		dtype := fmt.Sprintf(" dtype=%q", dt)
		if dt == "f32" {
			dtype = "" // the default
		}
		result("uniform_"+dt, dt+"[4,3,5]", "random "+key, `dist="uniform" stream=2 dims=[5]`+dtype)
		result("normal_"+dt, dt+"[4,3,2,70]", "random "+key, `dist="normal" stream=-3 dims=[2,70]`+dtype)
		result("dropout_"+dt, dt+"[4,3,7]", "random "+key, `dist="dropout" stream=1 dims=[7] p=0.3`+dtype)
		x := state("x_"+dt, dt+"[4,3,5]")
		s := state("cdf_"+dt, dt+"[4,3,5]")
		fmt.Fprintf(&b, "update %s = %s\n", s, val("normal_cdf %s : %s[4,3,5]%s", x, dt, strings.ReplaceAll(" {"+pl+"}", "{ ", "{")))
	}
	result("uniform_plain", "f32[4,3]", "random "+key, `dist="uniform" stream=9`)
	return b.String()
}

// randomExact are the results the backend gives to the CPU's bits on any
// GPU: the uniform draws and dropout's decisions are integer work and one
// rounding. randomNear are computed in double through log, cos and erfc,
// whose last places may differ between CUDA's math library and Go's: to
// the bit in the emulator (glibc's), to one unit of the result's format
// on a GPU.
func randomNames() (exact, near []string) {
	exact = []string{"uniform_plain"}
	for _, dt := range randomDTypes {
		exact = append(exact, "uniform_"+dt, "dropout_"+dt)
		near = append(near, "normal_"+dt, "cdf_"+dt)
	}
	return exact, near
}

func lowerRandom(t *testing.T, mesh, place string) *lower.Program {
	t.Helper()
	m, err := ir.Parse("random.gir", randomText(mesh, place))
	require.NoError(t, err)
	require.NoError(t, ir.Verify(m, ""))
	p, err := lower.Lower(m)
	require.NoError(t, err)
	return p
}

// randomInputs writes the same key and x to every host: keys −1 (no
// noise), other negative ones, the extremes and arbitrary ones; x over
// Φ's whole range, both tails included.
func randomInputs(t *testing.T, hs ...host) {
	t.Helper()
	r := rand.New(rand.NewPCG(5, 17))
	key := []int32{-1, 0, 7, -2, math.MinInt32, math.MaxInt32, -1, int32(r.Uint32()), int32(r.Uint32()), 12345, -987654, -1}
	x := make([]float64, 4*3*5)
	for i := range x {
		x[i] = r.NormFloat64() * 4
	}
	copy(x, []float64{0, -9, -14, 9, math.Inf(-1), math.Inf(1), math.NaN(), -40})
	for _, h := range hs {
		require.NoError(t, h.SetInt32("key", key))
		for _, dt := range randomDTypes {
			require.NoError(t, h.SetFloat64s("x_"+dt, x), dt)
		}
	}
}

// requireNear checks the near results: to the bit in the emulator, and
// on a GPU to one unit in the last place of the result's format (a
// float32 one apart may round to 16-bit values one apart).
func requireNear(t *testing.T, names []string, ref, got host) {
	t.Helper()
	if !onGPU() {
		requireSameBits(t, names, ref, got)
		return
	}
	for _, name := range names {
		rel := map[string]float64{"f32": 0x1p-23, "bf16": 0x1p-7, "f16": 0x1p-10}[name[strings.LastIndex(name, "_")+1:]]
		want, err := ref.Float64s(name)
		require.NoError(t, err)
		g, err := got.Float64s(name)
		require.NoError(t, err)
		require.Len(t, g, len(want), name)
		for i, w := range want {
			if math.IsNaN(w) || math.IsInf(w, 0) {
				require.Equal(t, math.Float64bits(w), math.Float64bits(g[i]), "%s[%d]", name, i)
				continue
			}
			require.InDelta(t, w, g[i], math.Abs(w)*rel+0x1p-40, "%s[%d]", name, i)
		}
	}
}

// Every dist of random and normal_cdf run on the backend as on the CPU's,
// in f32 and the 16-bit formats: uniform and dropout to the bit, normal
// and Φ to the bit in the emulator (within a unit on a GPU), key −1
// giving the centre.
func TestRandomOpsMatchCPU(t *testing.T) {
	rt := openTest(t)
	p := lowerRandom(t, "", "")
	plan, _, err := Plan([]*lower.Program{p}, 0)
	require.NoError(t, err)
	seen := map[string]int{}
	kernels := map[string]int{}
	for _, ip := range plan {
		assert.Empty(t, strayKernels(ip), "%s launches kernels the kernel table does not give it", ip.Op)
		seen[ip.Op]++
		for _, s := range ip.Steps {
			if m := launched.FindStringSubmatch(s); m != nil {
				kernels[m[1]]++
			}
		}
	}
	assert.Equal(t, 3*len(randomDTypes)+1, seen["random"])
	assert.Equal(t, len(randomDTypes), seen["normal_cdf"])
	for k, n := range map[string]int{"gc_random_uniform": 4, "gc_random_normal": 3, "gc_random_dropout": 3, "gc_normal_cdf": 3} {
		assert.Equal(t, n, kernels[k], k)
	}

	ref, err := cpu.Load(p, cpu.Options{})
	require.NoError(t, err)
	d, err := Load(rt, p, Options{})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, d.Close()) })
	randomInputs(t, ref, d)
	require.NoError(t, ref.Step())
	require.NoError(t, d.Step())
	exact, near := randomNames()
	requireSameBits(t, exact, ref, d)
	requireNear(t, near, ref, d)

	// Key 0 is −1: the centre, for every draw.
	for name, centre := range map[string]float64{"uniform_f32": 0.5, "normal_bf16": 0, "dropout_f16": 1} {
		v, err := d.Float64s(name)
		require.NoError(t, err)
		per := len(v) / 12
		for j := range per {
			require.Equal(t, centre, v[j], "%s: key -1, draw %d", name, j)
		}
	}
}

// Split over the keys (the sharding rule keeps the trailing dims whole),
// each device draws its keys' numbers: the assembled results are the CPU
// cluster's, and so the whole tensor's.
func TestRandomSplitOverKeys(t *testing.T) {
	rt := openTest(t)
	p := lowerRandom(t, "tp=2", "S(0)")
	local := 0
	for _, in := range p.Instrs {
		if in.Op == "random" {
			assert.Equal(t, 2, in.ArgTypes[0].Shape[0], "random has the local key")
			local++
		}
	}
	require.Equal(t, 3*len(randomDTypes)+1, local)
	ref, err := cpu.NewCluster(p, cpu.Options{})
	require.NoError(t, err)
	cl, err := NewCluster(rt, p, Options{})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, cl.Close()) })
	randomInputs(t, globalHost{ref}, globalHost{cl})
	require.NoError(t, ref.Step())
	require.NoError(t, cl.Step())
	exact, near := randomNames()
	requireSameBits(t, exact, globalHost{ref}, globalHost{cl})
	requireNear(t, near, globalHost{ref}, globalHost{cl})

	whole, err := cpu.Load(lowerRandom(t, "", ""), cpu.Options{})
	require.NoError(t, err)
	randomInputs(t, whole)
	require.NoError(t, whole.Step())
	requireSameBits(t, exact, whole, globalHost{cl})
}

// A local result that is not the local key times dims (a split of the
// draws, which the kernels do not index) is refused at load.
func TestRandomRefusesMismatchedShapes(t *testing.T) {
	p := lowerRandom(t, "", "")
	q := *p
	q.Instrs = append([]lower.Instr(nil), p.Instrs...)
	for i, in := range q.Instrs {
		if in.Op == "random" {
			s := in.OutType.Shape.Clone()
			s[len(s)-1]--
			in.OutType = ir.Type{DType: in.OutType.DType, Shape: s}
			q.Instrs[i] = in
			break
		}
	}
	_, _, err := Plan([]*lower.Program{&q}, 0)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "random: local result [4 3 4] is not the local key [4 3] times dims [5]")
}
