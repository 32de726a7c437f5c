package sample

import (
	"fmt"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseBlend(t *testing.T) {
	tests := []struct {
		in   string
		want []BlendPart
		err  error
	}{
		{in: "data/a", want: []BlendPart{{1, "data/a"}}},
		{in: "  data/a\n", want: []BlendPart{{1, "data/a"}}},
		{in: "0.3 A 0.7 B", want: []BlendPart{{0.3, "A"}, {0.7, "B"}}},
		{in: "30 A 70 B", want: []BlendPart{{0.3, "A"}, {0.7, "B"}}},
		{in: "1 A 0 B 1 C", want: []BlendPart{{0.5, "A"}, {0, "B"}, {0.5, "C"}}},
		{in: "", err: ErrBlendEmpty},
		{in: "0.5", err: ErrBlendPrefix},
		{in: "0.3 A 0.7", err: ErrBlendPrefix},
		{in: "0.3 0.7 A B", err: ErrBlendPrefix},
		{in: "0.3 A B", err: ErrBlendOdd},
		{in: "A B", err: ErrBlendWeight},
		{in: "0.3 A x B", err: ErrBlendWeight},
		{in: "NaN A", err: ErrBlendWeight},
		{in: "-1 A 2 B", err: ErrBlendNegative},
		{in: "0 A 0 B", err: ErrBlendZero},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseBlend(tc.in)
			if tc.err != nil {
				require.ErrorIs(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			require.Len(t, got, len(tc.want))
			for i := range got {
				assert.Equal(t, tc.want[i].Prefix, got[i].Prefix)
				assert.InDelta(t, tc.want[i].Weight, got[i].Weight, 1e-15)
			}
		})
	}
}

// countingSampler is a Sampler of n samples that writes its name and the
// sample number into dst.
type countingSampler struct {
	id  int32
	n   int64
	seq int
}

func (c *countingSampler) Sample(seed, k int64, dst []int32) error {
	if len(dst) != c.seq+1 {
		return ErrDst
	}
	dst[0], dst[1] = c.id, int32(k)
	return nil
}
func (c *countingSampler) SamplesPerEpoch() int64 { return c.n }
func (c *countingSampler) Seq() int               { return c.seq }

func samplers(n int, per int64) []Sampler {
	out := make([]Sampler, n)
	for i := range out {
		out[i] = &countingSampler{id: int32(i), n: per, seq: 3}
	}
	return out
}

// TestBlendMixture checks that every prefix of the first 10,000 samples
// follows the weights to within about a sample, and that each dataset's own
// sample numbers come 0, 1, 2, … in order.
func TestBlendMixture(t *testing.T) {
	sets := [][]float64{
		{0.3, 0.7},
		{0.1, 0.2, 0.7},
		{0.999, 0.001},
		{0.5, 0.5},
		{1, 1, 1},
		{0.05, 0.15, 0.3, 0.25, 0.25},
		{0.4, 0, 0.6},
		{1},
	}
	const n = 10000
	for _, w := range sets {
		t.Run(fmt.Sprint(w), func(t *testing.T) {
			b, err := NewBlend(w, samplers(len(w), 1<<40))
			require.NoError(t, err)
			norm := b.Weights()
			counts := make([]int64, len(w))
			worst := 0.0
			dst := make([]int32, 4)
			for k := range int64(n) {
				part, local, err := b.Pick(k)
				require.NoError(t, err)
				require.Equal(t, counts[part], local, "sample %d: dataset %d's samples come in order", k, part)
				require.NoError(t, b.Sample(7, k, dst))
				require.Equal(t, []int32{int32(part), int32(local)}, dst[:2])
				counts[part]++
				for i, c := range counts {
					worst = max(worst, math.Abs(float64(c)-float64(k+1)*norm[i]))
				}
			}
			assert.Equal(t, counts, b.Counts(n))
			assert.LessOrEqual(t, worst, 1.0, "largest gap of any prefix from its weights, in samples")
			for i := range w {
				share := float64(counts[i]) / n
				assert.InDelta(t, norm[i], share, 0.01*max(norm[i], 0.01), "dataset %d's share over %d samples", i, n)
				if norm[i] == 0 {
					assert.Zero(t, counts[i])
				}
			}
			t.Logf("weights %v: counts over %d %v, worst prefix gap %.3f samples", w, n, counts, worst)
		})
	}
}

// TestBlendFarLookup checks a lookup far out (k up to 2^40) without running
// from 0: the local number equals the dataset's count of earlier samples.
func TestBlendFarLookup(t *testing.T) {
	b, err := NewBlend([]float64{0.1, 0.2, 0.7}, samplers(3, 1<<50))
	require.NoError(t, err)
	for _, k := range []int64{1 << 20, 1<<40 - 1, 1 << 40, 123456789012} {
		part, local, err := b.Pick(k)
		require.NoError(t, err)
		assert.Equal(t, b.Counts(k)[part], local)
		after := b.Counts(k + 1)
		before := b.Counts(k)
		for i := range after {
			d := after[i] - before[i]
			if i == part {
				assert.EqualValues(t, 1, d)
			} else {
				assert.Zero(t, d)
			}
		}
		c := b.Counts(k)
		for i, w := range b.Weights() {
			assert.InDelta(t, float64(k)*w, float64(c[i]), 1.0)
		}
	}
	_, _, err = b.Pick(-1)
	assert.ErrorIs(t, err, ErrSampleNumber)
	_, _, err = b.Pick(math.MaxInt64)
	assert.ErrorIs(t, err, ErrSampleNumber)
}

func TestBlendEpoch(t *testing.T) {
	parts := []Sampler{
		&countingSampler{id: 0, n: 100, seq: 3},
		&countingSampler{id: 1, n: 1000, seq: 3},
	}
	b, err := NewBlend([]float64{0.5, 0.5}, parts)
	require.NoError(t, err)
	n := b.SamplesPerEpoch()
	c := b.Counts(n)
	assert.LessOrEqual(t, c[0], int64(100))
	assert.LessOrEqual(t, c[1], int64(1000))
	c = b.Counts(n + 1)
	assert.True(t, c[0] > 100 || c[1] > 1000, "one more sample repeats one")
	assert.InDelta(t, 200, n, 2)
}

func TestNewBlendErrors(t *testing.T) {
	good := samplers(2, 10)
	other := &countingSampler{n: 10, seq: 5}
	tests := []struct {
		name  string
		w     []float64
		parts []Sampler
		err   error
	}{
		{"none", nil, nil, ErrBlendEmpty},
		{"counts differ", []float64{1}, good, ErrBlendParts},
		{"negative", []float64{-1, 2}, good, ErrBlendNegative},
		{"zero sum", []float64{0, 0}, good, ErrBlendZero},
		{"NaN", []float64{math.NaN(), 1}, good, ErrBlendWeight},
		{"nil part", []float64{1, 1}, []Sampler{good[0], nil}, ErrBlendParts},
		{"nil GPT", []float64{1, 1}, []Sampler{good[0], (*GPT)(nil)}, ErrBlendParts},
		{"seq differs", []float64{1, 1}, []Sampler{good[0], other}, ErrBlendParts},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewBlend(tc.w, tc.parts)
			assert.ErrorIs(t, err, tc.err)
		})
	}
}
