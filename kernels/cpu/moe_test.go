package cpu

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestTopKMask(t *testing.T) {
	nan := math.NaN()
	cases := []struct {
		name string
		x    []float64
		k    int
		want []float64
	}{
		{"largest", []float64{0.1, 0.7, 0.2}, 1, []float64{0, 1, 0}},
		{"two", []float64{0.1, 0.7, 0.2}, 2, []float64{0, 1, 1}},
		{"tie goes to the lower index", []float64{0.5, 0.5, 0.5, 0.1}, 2, []float64{1, 1, 0, 0}},
		{"nan ranks lowest", []float64{nan, -3, -4}, 2, []float64{0, 1, 1}},
		{"all", []float64{3, 1, 2}, 3, []float64{1, 1, 1}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out := make([]float64, len(c.x))
			TopKMask(out, c.x, 1, len(c.x), c.k)
			assert.Equal(t, c.want, out)
		})
	}
}

// TestMoERouteOrder: within a group every first choice is placed (in
// token order) before any second choice, so a full expert drops second
// choices first; ties in score go to the lower expert.
func TestMoERouteOrder(t *testing.T) {
	// One group, 4 tokens, 2 experts, top-2 (every token selects both).
	scores := []float64{
		0.9, 0.1, // token 0: e0 first
		0.2, 0.8, // token 1: e1 first
		0.6, 0.4, // token 2: e0 first
		0.5, 0.5, // token 3: tie, e0 first
	}
	mask := []float64{1, 1, 1, 1, 1, 1, 1, 1}
	d := MoEDims{G: 1, T: 4, E: 2, C: 3}
	src := make([]int32, 6)
	MoERoute(src, scores, mask, d)
	// First choices: e0 ← 0, 2, 3; e1 ← 1. Then second choices in token
	// order: e1 ← 0, 2 (e1 full at 3), tokens 1 and 3 dropped from e0 and
	// e1 respectively (e0 is full).
	assert.Equal(t, []int32{0, 2, 3, 1, 0, 2}, src)

	// Capacity larger than the choices: empty slots are −1.
	d.C = 5
	src = make([]int32, 10)
	MoERoute(src, scores, []float64{1, 0, 0, 1, 1, 0, 0, 0}, d)
	assert.Equal(t, []int32{0, 2, -1, -1, -1, 1, -1, -1, -1, -1}, src)
}

// TestMoEDispatchCombineRoundTrip: with identity experts, top-1 routing
// and no drops, combine(dispatch(x)) is x exactly; with the gates as
// weights each token comes back scaled by its gate.
func TestMoEDispatchCombineRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	d := MoEDims{G: 3, T: 8, M: 5, E: 4, C: 8}
	x := make([]float32, d.G*d.T*d.M)
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	scores := make([]float32, d.G*d.T*d.E)
	for i := range scores {
		scores[i] = r.Float32()
	}
	mask := make([]float32, len(scores))
	TopKMask(mask, scores, d.G*d.T, d.E, 1)
	src := make([]int32, d.G*d.E*d.C)
	MoERoute(src, scores, mask, d)
	buf := make([]float32, d.E*d.G*d.C*d.M)
	require.NoError(t, MoEDispatch(buf, x, src, nil, d))
	back := make([]float32, len(x))
	require.NoError(t, MoECombine(back, buf, src, nil, d))
	assert.Equal(t, x, back)

	w := make([]float32, len(src))
	require.NoError(t, MoESlotGather(w, scores, src, d))
	require.NoError(t, MoECombine(back, buf, src, w, d))
	for g := range d.G {
		for tok := range d.T {
			gate := float32(0)
			for e := range d.E {
				gate += mask[(g*d.T+tok)*d.E+e] * scores[(g*d.T+tok)*d.E+e]
			}
			for m := range d.M {
				i := (g*d.T+tok)*d.M + m
				assert.Equal(t, gate*x[i], back[i])
			}
		}
	}
}

func TestMoEBadIndex(t *testing.T) {
	d := MoEDims{G: 1, T: 2, M: 1, E: 1, C: 1}
	err := MoEDispatch(make([]float64, 1), make([]float64, 2), []int32{2}, nil, d)
	assert.ErrorContains(t, err, "names token 2 of a group of 2")
}

// TestRandomDistributions: the counter-based draws have the moments of
// their distributions, are a function of (key, stream, index) alone, and
// give the centre for key −1.
func TestRandomDistributions(t *testing.T) {
	const keys, n = 1000, 100
	k := make([]int32, keys)
	for i := range k {
		k[i] = int32(i * 7919)
	}
	moments := func(x []float64) (mean, variance float64) {
		for _, v := range x {
			mean += v / float64(len(x))
		}
		for _, v := range x {
			variance += (v - mean) * (v - mean) / float64(len(x))
		}
		return mean, variance
	}
	u := make([]float64, keys*n)
	RandomUniform(u, k, 3, n)
	m, v := moments(u)
	assert.InDelta(t, 0.5, m, 0.005)
	assert.InDelta(t, 1.0/12, v, 0.002)
	assert.Greater(t, slices.Min(u), 0.0)
	assert.Less(t, slices.Max(u), 1.0)

	z := make([]float64, keys*n)
	RandomNormal(z, k, 3, n)
	m, v = moments(z)
	assert.InDelta(t, 0, m, 0.01)
	assert.InDelta(t, 1, v, 0.02)

	d := make([]float64, keys*n)
	RandomDropout(d, k, 3, n, 0.25)
	m, _ = moments(d)
	assert.InDelta(t, 1, m, 0.01, "inverted dropout keeps the mean")
	for _, x := range d {
		assert.Contains(t, []float64{0, 1 / 0.75}, x)
	}

	again := make([]float64, keys*n)
	RandomUniform(again, k, 3, n)
	assert.Equal(t, u, again, "a pure function of key, stream and index")
	RandomUniform(again, k, 4, n)
	assert.NotEqual(t, u[:n], again[:n], "another stream draws other numbers")
	f32 := make([]float32, keys*n)
	RandomUniform(f32, k, 3, n)
	for i := range u {
		require.Equal(t, float32(u[i]), f32[i], "both float types draw the same 24-bit numbers")
	}

	// The extremes are float32s strictly inside (0, 1).
	assert.Less(t, float32(unit23(0x7fffff)), float32(1))
	assert.Equal(t, unit23(0x7fffff), float64(float32(unit23(0x7fffff))))
	assert.Greater(t, float32(unit23(0)), float32(0))

	eval := []int32{-1}
	one := make([]float64, 2)
	RandomUniform(one, eval, 3, 2)
	assert.Equal(t, []float64{0.5, 0.5}, one)
	RandomNormal(one, eval, 3, 2)
	assert.Equal(t, []float64{0, 0}, one)
	RandomDropout(one, eval, 3, 2, 0.5)
	assert.Equal(t, []float64{1, 1}, one)
}

func TestNormalCDF(t *testing.T) {
	x := []float64{-8, -1.96, 0, 1, 1.96}
	out := make([]float64, len(x))
	NormalCDF(out, x)
	want := []float64{6.22096057427178e-16, 0.024997895148220435, 0.5, 0.8413447460685429, 0.9750021048517795}
	for i := range x {
		assert.InEpsilon(t, want[i], out[i], 1e-12, "Φ(%g)", x[i])
	}
}
