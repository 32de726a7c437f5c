package frontend_test

import (
	"errors"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/frontend"
	"gcompile/ir"
)

// tinyLM is a model whose sizes all come from --set and --batch, as a
// real model's do: an embedding, a projection, a loss.
func tinyLM(b *frontend.Builder) {
	vocab := b.Int("vocab", 16, "vocabulary")
	hidden := b.Int("hidden", 8, "width")
	seq := b.Int("seq", 4, "sequence length")
	tokens := b.Input("tokens", ir.I32, b.Batch(), seq)
	wte := b.Param("wte.weight", []int{vocab, hidden}, frontend.Normal(0.02), frontend.NoParallel)
	h := wte.Gather(tokens)
	b.Loss(h.Mean())
}

// Sizes a user passes (--set, --batch) that no int64 can hold are named
// errors at the line that made the tensor, naming the tensor and its
// dims: never a panic, a wrapped size or an arena of the wrong size
// later.
func TestHugeUserSizesAreNamedErrors(t *testing.T) {
	const tera = "1099511627776" // 2^40: fits an int, not when squared
	tests := []struct {
		name  string
		batch int
		set   map[string]string
		want  []string // all in the error
		size  bool     // an *ir.SizeError is in the chain
	}{
		{"param from --set", 0, map[string]string{"vocab": tera, "hidden": tera},
			[]string{`size_test.go:`, `param "wte.weight": f32[1099511627776,1099511627776] has 1.21e+24 elements, more than int64 holds`}, true},
		{"param bytes", 0, map[string]string{"vocab": "2147483648", "hidden": "2147483648"},
			[]string{`param "wte.weight": f32[2147483648,2147483648] takes 1.84e+19 bytes (4 per element), more than int64 holds`}, true},
		{"input from --batch", 1 << 40, map[string]string{"seq": tera},
			[]string{`size_test.go:`, `input "tokens": i32[1099511627776,1099511627776] has 1.21e+24 elements, more than int64 holds`}, true},
		{"negative --batch", -3, nil, []string{"--batch -3: want a positive number of sequences"}, false},
		{"negative --set", 0, map[string]string{"hidden": "-8"}, []string{"--set hidden=-8: want a positive integer"}, false},
		{"--set past int", 0, map[string]string{"hidden": "1e30"}, []string{"--set hidden=1e30: want a positive integer"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var m *ir.Module
			var err error
			require.NotPanics(t, func() {
				m, err = frontend.Build(tinyLM, frontend.Config{Name: "lm", Batch: tt.batch, Set: tt.set})
			})
			require.Error(t, err)
			assert.Nil(t, m)
			for _, w := range tt.want {
				assert.ErrorContains(t, err, w)
			}
			var se *ir.SizeError
			assert.Equal(t, tt.size, errors.As(err, &se), "an *ir.SizeError is wrapped, not flattened: %v", err)
		})
	}
}

// The same sizes reached through ops rather than sources: the op's type
// rule refuses the result at the user's line.
func TestOpsWithHugeResultsAreNamedErrors(t *testing.T) {
	const tera = 1 << 40
	tests := []struct {
		name string
		fn   frontend.ModelFunc
		want string
	}{
		{"matmul", func(b *frontend.Builder) {
			x := b.Param("x", []int{tera, 2}, frontend.Zeros, frontend.NoParallel)
			w := b.Param("w", []int{2, tera}, frontend.Zeros, frontend.NoParallel)
			b.Loss(x.MatMul(w).Sum())
		}, "matmul: f32[1099511627776,1099511627776] has 1.21e+24 elements, more than int64 holds"},
		{"broadcast", func(b *frontend.Builder) {
			x := b.Param("x", []int{tera, 1}, frontend.Zeros, frontend.NoParallel)
			b.Loss(x.Broadcast(tera, tera).Sum())
		}, "broadcast: f32[1099511627776,1099511627776] has 1.21e+24 elements"},
		{"reshape", func(b *frontend.Builder) {
			x := b.Param("x", []int{4}, frontend.Zeros, frontend.NoParallel)
			b.Loss(x.Reshape(tera, tera).Sum())
		}, "reshape to [1099511627776,1099511627776]: shape [1099511627776,1099511627776] has 1.21e+24 elements"},
		{"constant", func(b *frontend.Builder) {
			b.Loss(b.Constant("table", []float64{1}, tera, tera).Sum())
		}, `constant "table": shape [1099511627776,1099511627776] has 1.21e+24 elements`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var err error
			require.NotPanics(t, func() { _, err = frontend.Build(tt.fn, frontend.Config{}) })
			require.Error(t, err)
			assert.ErrorContains(t, err, tt.want)
			assert.ErrorContains(t, err, "size_test.go:")
		})
	}
}

// Sizes that fit are still accepted, however large: the frontend only
// records shapes, so a 4 TiB param builds (the runtime decides whether
// it fits in memory).
func TestLargeSizesThatFitBuild(t *testing.T) {
	m, err := frontend.Build(tinyLM, frontend.Config{Set: map[string]string{"vocab": strconv.Itoa(1 << 20), "hidden": strconv.Itoa(1 << 20)}})
	require.NoError(t, err)
	w := m.Source("wte.weight")
	require.NotNil(t, w)
	n, err := w.Type.ByteSize()
	require.NoError(t, err)
	assert.Equal(t, int64(1)<<42, n)
}
