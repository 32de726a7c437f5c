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

// The routing sizes of the MoE module: 2 groups of 6 tokens, 4 experts;
// a top-2 router over capacity 2 drops choices (12 per group for 8
// slots), capacity 5 leaves slots empty.
const (
	moeG, moeT, moeE, moeM = 2, 6, 4, 5
	moeC, moeWide          = 2, 5
)

// moeText is a module of every MoE op, each result written to a state of
// its name. Expert values (x, y) are of dtype ed, the router's (scores,
// the top-k mask, the gathered and scattered gates) of rd, the slot
// weights of wd: f32 beside 16-bit experts (F32Args), or their own dtype.
// src is an i32 state read by the slot ops beside the routed index, so a
// test can give them any index.
func moeText(ed, rd, wd string) string {
	var b strings.Builder
	b.WriteString("gir 1\nmodule \"moe\"\n")
	n := 0
	val := func(format string, a ...any) string {
		id := fmt.Sprintf("%%%d", n)
		n++
		fmt.Fprintf(&b, "%s = "+format+"\n", append([]any{id}, a...)...)
		return id
	}
	ty := func(dt string, dims ...int) string {
		s := make([]string, len(dims))
		for i, d := range dims {
			s[i] = fmt.Sprint(d)
		}
		return dt + "[" + strings.Join(s, ",") + "]"
	}
	state := func(name, t string) string { return val("state : %s {name=%q}", t, name) }
	// result writes op (args and attributes cut at " {") to a state.
	result := func(name, t, op string) {
		s := state(name, t)
		args, attrs, _ := strings.Cut(op, " {")
		if attrs != "" {
			attrs = " {" + attrs
		}
		v := val("%s : %s%s", args, t, attrs)
		fmt.Fprintf(&b, "update %s = %s\n", s, v)
	}
	g, tk, e, m, c := moeG, moeT, moeE, moeM, moeC
	scores := state("scores", ty(rd, g, tk, e))
	thr := state("threshold", ty(rd, g, tk, e))
	x := state("x", ty(ed, g, tk, m))
	y := state("y", ty(ed, e, g, c, m))
	w := state("w", ty(wd, g, e, c))
	src := state("src", ty("i32", g, e, c))

	mask := val("top_k_mask %s : %s {k=2}", scores, ty(rd, g, tk, e))
	routed := val("moe_route %s, %s : %s {capacity=%d}", scores, mask, ty("i32", g, e, c), c)
	fmt.Fprintf(&b, "update %s = %s\n", state("top_k_mask", ty(rd, g, tk, e)), mask)
	fmt.Fprintf(&b, "update %s = %s\n", state("moe_route", ty("i32", g, e, c)), routed)
	result("less", ty(rd, g, tk, e), fmt.Sprintf("less %s, %s", scores, thr))
	// Capacity 5 leaves slots empty; its index is the CPU's too.
	wide := val("moe_route %s, %s : %s {capacity=%d}", scores, mask, ty("i32", g, e, moeWide), moeWide)
	fmt.Fprintf(&b, "update %s = %s\n", state("moe_route_wide", ty("i32", g, e, moeWide)), wide)
	result("dispatch_wide", ty(ed, e, g, moeWide, m), fmt.Sprintf("moe_dispatch %s, %s", x, wide))

	result("dispatch", ty(ed, e, g, c, m), fmt.Sprintf("moe_dispatch %s, %s, %s", x, routed, w))
	result("dispatch_plain", ty(ed, e, g, c, m), fmt.Sprintf("moe_dispatch %s, %s", x, routed))
	result("combine", ty(ed, g, tk, m), fmt.Sprintf("moe_combine %s, %s, %s {tokens=%d}", y, routed, w, tk))
	result("combine_plain", ty(ed, g, tk, m), fmt.Sprintf("moe_combine %s, %s {tokens=%d}", y, routed, tk))
	edt, err := ir.ParseDType(ed)
	if err != nil {
		panic(err)
	}
	gate := ir.MoEGateDType(edt).String()
	result("slot_dot", ty(gate, g, e, c), fmt.Sprintf("moe_slot_dot %s, %s, %s", y, routed, x))
	result("slot_gather", ty(rd, g, e, c), fmt.Sprintf("moe_slot_gather %s, %s", scores, routed))
	result("slot_scatter", ty(wd, g, tk, e), fmt.Sprintf("moe_slot_scatter %s, %s {tokens=%d}", w, routed, tk))
	// The same on the given index.
	result("combine_src", ty(ed, g, tk, m), fmt.Sprintf("moe_combine %s, %s, %s {tokens=%d}", y, src, w, tk))
	result("slot_dot_src", ty(gate, g, e, c), fmt.Sprintf("moe_slot_dot %s, %s, %s", y, src, x))
	result("slot_scatter_src", ty(wd, g, tk, e), fmt.Sprintf("moe_slot_scatter %s, %s {tokens=%d}", w, src, tk))
	result("dispatch_src", ty(ed, e, g, c, m), fmt.Sprintf("moe_dispatch %s, %s, %s", x, src, w))
	return b.String()
}

var moeResults = []string{"top_k_mask", "moe_route", "less", "moe_route_wide", "dispatch_wide", "dispatch", "dispatch_plain",
	"combine", "combine_plain", "slot_dot", "slot_gather", "slot_scatter", "combine_src", "slot_dot_src", "slot_scatter_src", "dispatch_src"}

func lowerMoE(t *testing.T, ed, rd, wd string) *lower.Program {
	t.Helper()
	m, err := ir.Parse("moe.gir", moeText(ed, rd, wd))
	require.NoError(t, err)
	require.NoError(t, ir.Verify(m, ""))
	p, err := lower.Lower(m)
	require.NoError(t, err)
	return p
}

// moeInputs writes the same inputs to every host: scores from a few
// values, so routes tie, with a NaN; values over many binades, so a sum
// in another order would show; and an index in which token 1 sits in two
// slots of one expert, slots are empty and one token is in none.
func moeInputs(t *testing.T, src []int32, hs ...host) {
	t.Helper()
	r := rand.New(rand.NewPCG(7, 21))
	draw := func(n int, f func() float64) []float64 {
		v := make([]float64, n)
		for i := range v {
			v[i] = f()
		}
		return v
	}
	wide := func() float64 { return r.NormFloat64() * math.Ldexp(1, r.IntN(16)-8) }
	scores := draw(moeG*moeT*moeE, func() float64 { return float64(r.IntN(5)-2) * 0.25 })
	scores[3] = math.NaN()
	inputs := map[string][]float64{
		"scores":    scores,
		"threshold": draw(moeG*moeT*moeE, func() float64 { return float64(r.IntN(5)-2) * 0.25 }),
		"x":         draw(moeG*moeT*moeM, wide),
		"y":         draw(moeE*moeG*moeC*moeM, wide),
		"w":         draw(moeG*moeE*moeC, wide),
	}
	for _, h := range hs {
		for name, v := range inputs {
			require.NoError(t, h.SetFloat64s(name, v), name)
		}
		require.NoError(t, h.SetInt32("src", src))
	}
}

// anySrc is a valid index that moe_route would not make: token 1 twice
// in expert 0 of group 0, token 0 in three slots of group 1 (so the order
// of its sum matters), tokens in no slot (5 in group 0, 4 in group 1),
// empty slots.
var anySrc = []int32{1, 1, 0, -1, 2, 3, -1, 4, 5, 0, 3, 0, -1, 2, 1, 0}

// Every MoE op runs on the backend as on the CPU's, to the bit: the
// selections, moves and the combine's ordered sums are exact, 16-bit
// operands go through the same widening and rounding, and the gates'
// gradient's double sums round to the same floats. f32 throughout;
// bf16 experts beside an f32 router and f32 slot weights (mixed
// precision); fp16 everywhere, weights included.
func TestMoEOpsMatchCPU(t *testing.T) {
	rt := openTest(t)
	for _, dts := range [][3]string{{"f32", "f32", "f32"}, {"bf16", "f32", "f32"}, {"f16", "f16", "f16"}} {
		t.Run(strings.Join(dts[:], "_"), func(t *testing.T) {
			p := lowerMoE(t, dts[0], dts[1], dts[2])
			plan, _, err := Plan([]*lower.Program{p}, 0)
			require.NoError(t, err)
			seen := map[string]int{}
			for _, ip := range plan {
				assert.Empty(t, strayKernels(ip), "%s launches kernels the kernel table does not give it", ip.Op)
				seen[ip.Op]++
			}
			for op, n := range map[string]int{"top_k_mask": 1, "less": 1, "moe_route": 2, "moe_dispatch": 4, "moe_combine": 3,
				"moe_slot_dot": 2, "moe_slot_gather": 1, "moe_slot_scatter": 2} {
				assert.Equal(t, n, seen[op], op)
			}

			ref, err := cpu.Load(p, cpu.Options{})
			require.NoError(t, err)
			d, err := Load(rt, p, Options{})
			require.NoError(t, err)
			t.Cleanup(func() { assert.NoError(t, d.Close()) })
			moeInputs(t, anySrc, ref, d)
			require.NoError(t, ref.Step())
			require.NoError(t, d.Step())
			requireSameBits(t, moeResults, ref, d)

			// The routes did drop tokens and leave slots empty.
			route, err := ref.Float64s("moe_route")
			require.NoError(t, err)
			placed := 0
			for _, v := range route {
				if v >= 0 {
					placed++
				}
			}
			assert.Less(t, placed, 2*moeG*moeT, "capacity 2 drops some of the top-2 choices")
			wide, err := ref.Float64s("moe_route_wide")
			require.NoError(t, err)
			assert.Contains(t, wide, -1.0, "capacity 5 has empty slots")
		})
	}
}

// A slot naming no token of its group cannot fail inside a kernel: it
// counts as empty and sets the status word, and the step reports the
// instruction, as the CPU backend refuses the index.
func TestMoEBadSlotFailsTheStep(t *testing.T) {
	rt := openTest(t)
	p := lowerMoE(t, "f32", "f32", "f32")
	ref, err := cpu.Load(p, cpu.Options{})
	require.NoError(t, err)
	d, err := Load(rt, p, Options{})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, d.Close()) })
	bad := append([]int32(nil), anySrc...)
	bad[13] = moeT
	moeInputs(t, bad, ref, d)
	assert.ErrorContains(t, ref.Step(), "names token 6 of a group of 6")
	err = d.Step()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "moe_")
	assert.Contains(t, err.Error(), "slot (group 1, expert 2, position 1) names token 6 of a group of 6")
}

// Local shapes that do not agree with the index (a split the kernels do
// not index) are refused at load.
func TestMoERefusesMismatchedShapes(t *testing.T) {
	p := lowerMoE(t, "f32", "f32", "f32")
	for _, op := range []string{"moe_dispatch", "moe_combine", "moe_slot_dot", "moe_slot_gather", "moe_slot_scatter"} {
		q := *p
		q.Instrs = append([]lower.Instr(nil), p.Instrs...)
		for i, in := range q.Instrs {
			if in.Op == op {
				in.ArgTypes = append([]ir.Type(nil), in.ArgTypes...)
				s := in.ArgTypes[0].Shape.Clone()
				s[len(s)-1]++
				in.ArgTypes[0] = ir.Type{DType: in.ArgTypes[0].DType, Shape: s}
				q.Instrs[i] = in
				break
			}
		}
		_, _, err := Plan([]*lower.Program{&q}, 0)
		require.Error(t, err, op)
		assert.Contains(t, err.Error(), op+": local ", op)
	}
}
