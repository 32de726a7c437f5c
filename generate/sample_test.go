package generate

import (
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// softmax is the reference distribution: softmax(logits/t) over the
// indices in keep (all when keep is nil), 0 elsewhere.
func softmax(logits []float64, t float64, keep []int) []float64 {
	if keep == nil {
		for i := range logits {
			keep = append(keep, i)
		}
	}
	top := math.Inf(-1)
	for _, i := range keep {
		top = max(top, logits[i])
	}
	p := make([]float64, len(logits))
	z := 0.0
	for _, i := range keep {
		p[i] = math.Exp((logits[i] - top) / t)
		z += p[i]
	}
	for i := range p {
		p[i] /= z
	}
	return p
}

// frequencies draws n tokens (steps 0..n−1 of sequence 0) and returns how
// often each was drawn.
func frequencies(s Sampling, logits []float64, n int) []float64 {
	f := make([]float64, len(logits))
	for step := range n {
		f[s.Pick(logits, 0, step)]++
	}
	for i := range f {
		f[i] /= float64(n)
	}
	return f
}

func logsOf(p ...float64) []float64 {
	l := make([]float64, len(p))
	for i, x := range p {
		l[i] = math.Log(x)
	}
	return l
}

var eight = []float64{1.2, -0.3, 2.0, 0.5, -1.0, 1.9, 0.0, -2.5}

func TestGreedy(t *testing.T) {
	nan := math.NaN()
	for _, tc := range []struct {
		name   string
		logits []float64
		want   int
	}{
		{"single", []float64{3}, 0},
		{"argmax", []float64{0.1, 2.5, -1, 2.4}, 1},
		{"tie takes the lowest id", []float64{1, 7, 3, 7, 7}, 1},
		{"all equal", []float64{2, 2, 2}, 0},
		{"NaN is never the max", []float64{nan, 1, 2, 2}, 2},
		{"masked below real", []float64{-1e30, -50, math.Inf(-1)}, 1},
		{"+Inf", []float64{1, math.Inf(1), 3}, 1},
		{"all NaN", []float64{nan, nan}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, seed := range []uint64{0, 1, 12345, math.MaxUint64} {
				s := Sampling{Temperature: 0, TopK: 2, TopP: 0.1, Seed: seed}
				for step := range 20 {
					assert.Equal(t, tc.want, s.Pick(tc.logits, step%3, step), "seed %d step %d", seed, step)
				}
			}
		})
	}
}

func TestPickDeterministic(t *testing.T) {
	s := Sampling{Temperature: 1, TopP: 1, Seed: 7}
	flat := make([]float64, 8)

	// The same arguments give the same token, whatever was drawn in between
	// and whatever order the sequences are visited in.
	forward := map[[2]int]int{}
	for seq := range 16 {
		for step := range 16 {
			forward[[2]int{seq, step}] = s.Pick(eight, seq, step)
		}
	}
	for seq := 15; seq >= 0; seq-- {
		for step := 15; step >= 0; step-- {
			assert.Equal(t, forward[[2]int{seq, step}], s.Pick(eight, seq, step))
		}
	}

	for _, tc := range []struct {
		name string
		pick func(i int) int
	}{
		{"seeds", func(i int) int { return Sampling{Temperature: 1, TopP: 1, Seed: uint64(i)}.Pick(flat, 0, 0) }},
		{"steps", func(i int) int { return s.Pick(flat, 0, i) }},
		{"sequences", func(i int) int { return s.Pick(flat, i, 0) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			seen := map[int]bool{}
			for i := range 200 {
				seen[tc.pick(i)] = true
			}
			assert.Len(t, seen, len(flat), "200 draws over 8 equally likely tokens should cover them all")
		})
	}
}

// The generator is part of the reproducibility promise: a change to it
// changes every sampled sequence, so its outputs are pinned.
func TestUniformPinned(t *testing.T) {
	assert.Equal(t, uint64(0xe220a8397b1dcdaf), splitmix(0), "splitmix64's first output from state 0")
	h := splitmix(splitmix(splitmix(42)^3) ^ 7)
	assert.Equal(t, float64(h>>11)*0x1p-53, uniform(42, 3, 7))
	for i := range 1000 {
		u := uniform(uint64(i), i, -i)
		assert.True(t, u >= 0 && u < 1, "%v", u)
	}
	assert.NotEqual(t, uniform(1, 2, 3), uniform(1, 3, 2))
	assert.NotEqual(t, uniform(1, 2, 3), uniform(2, 1, 3))
}

func TestPickDistribution(t *testing.T) {
	for _, temp := range []float64{1, 0.5, 2} {
		want := softmax(eight, temp, nil)
		got := frequencies(Sampling{Temperature: temp, TopP: 1, Seed: 99}, eight, 10000)
		for i := range want {
			assert.InDelta(t, want[i], got[i], 0.02, "temperature %v token %d", temp, i)
		}
	}
}

func TestTopK(t *testing.T) {
	// Ranking of eight: 2 (2.0), 5 (1.9), 0 (1.2), 3 (0.5), 6 (0), 1, 4, 7.
	for _, tc := range []struct {
		k    int
		temp float64
		keep []int
	}{
		{1, 1, []int{2}},
		{2, 1, []int{2, 5}},
		{3, 1, []int{2, 5, 0}},
		{3, 0.5, []int{2, 5, 0}},
		{5, 2, []int{2, 5, 0, 3, 6}},
	} {
		want := softmax(eight, tc.temp, tc.keep)
		got := frequencies(Sampling{Temperature: tc.temp, TopK: tc.k, TopP: 1, Seed: 3}, eight, 5000)
		for i := range want {
			if !slices.Contains(tc.keep, i) {
				assert.Zero(t, got[i], "k %d: token %d is outside the top %d", tc.k, i, tc.k)
				continue
			}
			assert.InDelta(t, want[i], got[i], 0.02, "k %d temperature %v token %d", tc.k, tc.temp, i)
		}
	}

	// Ties at the cut are all kept, as Hugging Face keeps every logit not
	// below the k-th largest.
	tied := []float64{0, 5, 5, 5, 1}
	got := frequencies(Sampling{Temperature: 1, TopK: 2, TopP: 1}, tied, 3000)
	for _, id := range []int{1, 2, 3} {
		assert.InDelta(t, 1.0/3, got[id], 0.05, "id %d", id)
	}
	assert.Zero(t, got[0]+got[4])
	// A tie below the cut changes nothing.
	got = frequencies(Sampling{Temperature: 1, TopK: 1, TopP: 1}, []float64{0, 9, 5, 5}, 500)
	assert.Equal(t, 1.0, got[1])
}

// The nucleus rule: in ranking order, keep tokens until the cumulative
// probability first reaches TopP (that token included), as HF's
// TopPLogitsWarper does by removing tokens whose ascending cumulative
// probability is ≤ 1 − TopP.
func TestTopP(t *testing.T) {
	probs := []float64{0.5, 0.3, 0.15, 0.05}
	shuffled := []float64{0.15, 0.5, 0.05, 0.3} // same values, other ids
	for _, tc := range []struct {
		name  string
		probs []float64
		k     int
		p     float64
		keep  []int
	}{
		{"below the top token", probs, 0, 0.3, []int{0}},
		{"exactly the top token", probs, 0, 0.5, []int{0}},
		{"crossing is kept", probs, 0, 0.7, []int{0, 1}},
		{"reaching exactly stops", probs, 0, 0.8, []int{0, 1}},
		{"just past", probs, 0, 0.81, []int{0, 1, 2}},
		{"0.95 reached by three", probs, 0, 0.95, []int{0, 1, 2}},
		{"0.96 needs all", probs, 0, 0.96, []int{0, 1, 2, 3}},
		{"ranked by probability, not id", shuffled, 0, 0.7, []int{1, 3}},
		// After top-k 3 the probabilities are 0.526, 0.316, 0.158.
		{"after top-k, renormalised", probs, 3, 0.8, []int{0, 1}},
		{"after top-k, past", probs, 3, 0.85, []int{0, 1, 2}},
		// Top-k 3 keeps ids 0, 1, 2: 0.5, 0.25, 0.25.
		{"after top-k, reaching exactly stops", []float64{0.4, 0.2, 0.2, 0.1, 0.1}, 3, 0.75, []int{0, 1}},
		{"after top-k, just past", []float64{0.4, 0.2, 0.2, 0.1, 0.1}, 3, 0.76, []int{0, 1, 2}},
		// Top-k 3 keeps all four: the 4th is tied with the 3rd.
		{"after top-k with a tie at the cut", []float64{0.4, 0.2, 0.2, 0.2}, 3, 0.85, []int{0, 1, 2, 3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logits := logsOf(tc.probs...)
			s := Sampling{Temperature: 1, TopK: tc.k, TopP: tc.p, Seed: 11}
			want := softmax(logits, 1, tc.keep)
			got := frequencies(s, logits, 5000)
			for i := range logits {
				if !slices.Contains(tc.keep, i) {
					assert.Zero(t, got[i], "token %d is outside the nucleus", i)
					continue
				}
				assert.InDelta(t, want[i], got[i], 0.02, "token %d", i)
			}
		})
	}
}

// referenceNucleus is the nucleus by the rule's letter: sort everything,
// add probabilities until the sum reaches p.
func referenceNucleus(logits []float64, p float64) []int {
	var ids []int
	for i, x := range logits {
		if x > maskedLogit {
			ids = append(ids, i)
		}
	}
	sort.SliceStable(ids, func(a, b int) bool { return logits[ids[a]] > logits[ids[b]] })
	prob := softmax(logits, 1, ids)
	cum := 0.0
	for j, i := range ids {
		cum += prob[i]
		if cum >= p-nucleusSlack {
			ids = ids[:j+1]
			break
		}
	}
	slices.Sort(ids)
	return ids
}

// The partial rankings (a heap of k, widened for the nucleus) agree with
// sorting the whole vocabulary, ties included.
func TestRankingMatchesSort(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for trial := range 20 {
		n := 100 + r.IntN(3000)
		logits := make([]float64, n)
		for i := range logits {
			logits[i] = math.Round(r.NormFloat64()*float64(1+trial%4)*4) / 4 // many ties
			if r.IntN(10) == 0 {
				logits[i] = maskedLogit
			}
		}
		usable := 0
		for _, x := range logits {
			if x > maskedLogit {
				usable++
			}
		}
		all := ranked(logits, usable, usable)
		for _, k := range []int{1, 7, 50, usable - 1} {
			assert.Equal(t, all[:k], ranked(logits, k, usable), "trial %d k %d", trial, k)
		}
		for _, p := range []float64{0.1, 0.5, 0.9, 0.99} {
			w := weigher{logits, logits[all[0]], 1}
			got := w.nucleusAll(usable, p)
			slices.Sort(got)
			assert.Equal(t, referenceNucleus(logits, p), got, "trial %d p %v", trial, p)
		}
	}
}

// The nucleus quickselect agrees with sorting on inputs that defeat a
// naive pivot: logits already ranked, ranked backwards, or all equal.
func TestNucleusOrderedInputs(t *testing.T) {
	const n = 5000
	for _, tc := range []struct {
		name  string
		logit func(i int) float64
	}{
		{"ascending", func(i int) float64 { return float64(i) / 1000 }},
		{"descending", func(i int) float64 { return -float64(i) / 1000 }},
		{"all equal", func(int) float64 { return 1.5 }},
		{"two levels", func(i int) float64 { return float64(i % 2) }},
	} {
		logits := make([]float64, n)
		for i := range logits {
			logits[i] = tc.logit(i)
		}
		all := ranked(logits, n, n)
		w := weigher{logits, logits[all[0]], 1}
		for _, p := range []float64{0.01, 0.5, 0.9, 0.999} {
			got := w.nucleusAll(n, p)
			slices.Sort(got)
			want := referenceNucleus(logits, p)
			assert.Equal(t, want, got, "%s p %v", tc.name, p)
		}
	}
}

// A filter that keeps everything picks exactly what no filter picks: the
// draw runs over the kept ids in id order either way.
func TestFilterKeepingAllIsNoFilter(t *testing.T) {
	plain := Sampling{Temperature: 0.8, TopP: 1, Seed: 5}
	wide := Sampling{Temperature: 0.8, TopK: len(eight), TopP: 1, Seed: 5}
	wider := Sampling{Temperature: 0.8, TopK: 1000, TopP: 1, Seed: 5}
	for step := range 500 {
		want := plain.Pick(eight, 2, step)
		assert.Equal(t, want, wide.Pick(eight, 2, step))
		assert.Equal(t, want, wider.Pick(eight, 2, step))
	}
}

func TestMaskedNeverDrawn(t *testing.T) {
	nan := math.NaN()
	logits := []float64{-1e30, 0.3, nan, math.Inf(-1), 0.1, -2e30, -1e30, 0.2, nan}
	allowed := []int{1, 4, 7}
	for _, s := range []Sampling{
		{Temperature: 1, TopP: 1},
		{Temperature: 100, TopP: 1, Seed: 1},
		{Temperature: 1e6, TopP: 1, Seed: 2}, // flat enough that exp(−1e30/T) would not underflow
		{Temperature: 1, TopK: 8, TopP: 1, Seed: 3},
		{Temperature: 1, TopP: 0.999, Seed: 4},
		{Temperature: 1e6, TopK: 6, TopP: 0.9999, Seed: 5},
	} {
		got := frequencies(s, logits, 10000)
		for i, f := range got {
			if !slices.Contains(allowed, i) {
				assert.Zero(t, f, "%+v drew masked token %d", s, i)
			}
		}
	}

	// +Inf logits take all the probability, shared equally.
	inf := []float64{0, math.Inf(1), 3, math.Inf(1), nan}
	got := frequencies(Sampling{Temperature: 1, TopP: 1}, inf, 4000)
	assert.InDelta(t, 0.5, got[1], 0.03)
	assert.InDelta(t, 0.5, got[3], 0.03)

	// Nothing drawable: the argmax, every time.
	for _, tc := range []struct {
		logits []float64
		want   int
	}{
		{[]float64{-2e30, -1e30, math.Inf(-1)}, 1},
		{[]float64{nan, math.Inf(-1), nan}, 1},
		{[]float64{nan, nan}, 0},
	} {
		for step := range 50 {
			assert.Equal(t, tc.want, Sampling{Temperature: 1, TopK: 2, TopP: 0.5}.Pick(tc.logits, 0, step))
		}
	}

	assert.Panics(t, func() { Sampling{Temperature: 1, TopP: 1}.Pick(nil, 0, 0) })
}

func TestValidate(t *testing.T) {
	nan := math.NaN()
	for _, s := range []Sampling{
		{Temperature: 0, TopP: 1},
		{Temperature: 0.7, TopK: 50, TopP: 0.9, Seed: 1},
		{Temperature: 2, TopP: 1e-9},
	} {
		assert.NoError(t, s.Validate(), "%+v", s)
	}
	for _, tc := range []struct {
		s    Sampling
		want []string
	}{
		{Sampling{Temperature: -1, TopP: 1}, []string{"--temperature -1", "≥ 0"}},
		{Sampling{Temperature: nan, TopP: 1}, []string{"--temperature NaN", "≥ 0"}},
		{Sampling{Temperature: math.Inf(1), TopP: 1}, []string{"--temperature +Inf"}},
		{Sampling{Temperature: 1, TopP: 0}, []string{"--top-p 0", "0 < p ≤ 1"}},
		{Sampling{Temperature: 1, TopP: 1.5}, []string{"--top-p 1.5", "0 < p ≤ 1"}},
		{Sampling{Temperature: 1, TopP: nan}, []string{"--top-p NaN", "0 < p ≤ 1"}},
		{Sampling{Temperature: 1, TopP: -0.2}, []string{"--top-p -0.2"}},
		{Sampling{Temperature: 1, TopK: -1, TopP: 1}, []string{"--top-k -1", "k ≥ 0"}},
		{Sampling{Temperature: 1, TopK: -3, TopP: 1}, []string{"--top-k -3: want k ≥ 0 (0: no limit)"}},
		{Sampling{}, []string{"--top-p 0"}}, // the zero value: TopP unset
		{Sampling{Temperature: -1, TopK: -2, TopP: 2}, []string{"--temperature -1", "--top-k -2", "--top-p 2"}},
	} {
		err := tc.s.Validate()
		require.Error(t, err, "%+v", tc.s)
		for _, w := range tc.want {
			assert.Contains(t, err.Error(), w)
		}
	}
}

func BenchmarkPick(b *testing.B) {
	r := rand.New(rand.NewPCG(3, 4))
	logits := make([]float64, 50257)
	for i := range logits {
		logits[i] = r.NormFloat64() * 2
	}
	for _, bc := range []struct {
		name string
		s    Sampling
	}{
		{"greedy", Sampling{TopP: 1}},
		{"temperature", Sampling{Temperature: 0.8, TopP: 1}},
		{"topk50", Sampling{Temperature: 0.8, TopK: 50, TopP: 1}},
		{"topp0.9", Sampling{Temperature: 0.8, TopP: 0.9}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			step := 0
			for b.Loop() {
				bc.s.Pick(logits, 0, step)
				step++
			}
		})
	}
}

// The repetition penalty divides positive logits and multiplies negative
// ones, once per id however often it occurs, and leaves masked and NaN
// logits, and ids outside the vocabulary, alone.
func TestPenalize(t *testing.T) {
	logits := []float64{2, -2, 0, math.Inf(-1), -1e31, math.NaN(), 4}
	s := Sampling{TopP: 1, RepetitionPenalty: 2}
	got := s.Penalize(logits, []int32{0, 1, 1, 2, 3, 4, 5, 0, 99, -1})
	assert.Equal(t, []float64{1, -4, 0, math.Inf(-1), -1e31}, got[:5])
	assert.True(t, math.IsNaN(got[5]))
	assert.Equal(t, 4.0, got[6], "an id the sequence does not hold")
	assert.Equal(t, 2.0, logits[0], "the model's logits are not changed")
	below := Sampling{TopP: 1, RepetitionPenalty: 0.5}.Penalize([]float64{-1e30, -3}, []int32{0, 1})
	assert.Equal(t, []float64{-1e30, -1.5}, below, "a penalty below 1 never lifts a masked logit")
	for _, none := range []float64{0, 1} {
		same := Sampling{TopP: 1, RepetitionPenalty: none}.Penalize(logits, []int32{0})
		assert.Same(t, &logits[0], &same[0], "no penalty, no copy")
	}
	assert.ErrorContains(t, Sampling{TopP: 1, RepetitionPenalty: -1}.Validate(), "--repetition-penalty -1: want a finite penalty > 0 (1: none)")
	assert.ErrorContains(t, Sampling{TopP: 1, RepetitionPenalty: math.Inf(1)}.Validate(), "--repetition-penalty +Inf")
	assert.ErrorContains(t, Sampling{TopP: 1, RepetitionPenalty: math.NaN()}.Validate(), "--repetition-penalty NaN")
}
