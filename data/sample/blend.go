package sample

import (
	"fmt"
	"math"
	"math/bits"
	"slices"
	"strconv"
	"strings"
)

// BlendPart is one dataset of a blend and its share of the samples.
type BlendPart struct {
	// Weight is the dataset's share, normalised so a blend's weights sum
	// to 1.
	Weight float64
	// Prefix is the dataset's path without .bin or .idx, as Megatron's
	// --data-path takes it.
	Prefix string
}

// ParseBlend reads Megatron's --data-path form: "PREFIX", or weights and
// prefixes alternating, "0.3 A 0.7 B". A single prefix has weight 1;
// weights are normalised to sum to 1. Megatron also takes several prefixes
// without weights as equal shares; here a word in a weight's place must be
// a number, so a forgotten weight is reported rather than guessed.
func ParseBlend(s string) ([]BlendPart, error) {
	words := strings.Fields(s)
	example := `e.g. "0.3 PREFIX_A 0.7 PREFIX_B", or one PREFIX`
	weight := func(i int) (float64, error) {
		v, err := strconv.ParseFloat(words[i], 64)
		if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
			return 0, fmt.Errorf("%w: word %d, %q, stands where a weight belongs; write a number before each prefix, %s", ErrBlendWeight, i+1, words[i], example)
		}
		if v < 0 {
			return 0, fmt.Errorf("%w: %s (word %d); weights must be 0 or more", ErrBlendNegative, words[i], i+1)
		}
		return v, nil
	}
	switch {
	case len(words) == 0:
		return nil, fmt.Errorf("%w: give a dataset prefix, %s", ErrBlendEmpty, example)
	case len(words) == 1:
		if _, err := strconv.ParseFloat(words[0], 64); err == nil {
			return nil, fmt.Errorf("%w: %q is a number, not a dataset; %s", ErrBlendPrefix, words[0], example)
		}
		return []BlendPart{{Weight: 1, Prefix: words[0]}}, nil
	case len(words)%2 == 1:
		// A trailing number is a weight whose prefix was left out; any
		// other odd count does not pair up.
		last := len(words) - 1
		if _, err := strconv.ParseFloat(words[last], 64); err == nil {
			return nil, fmt.Errorf("%w: the last weight, %s, has no prefix after it; %s", ErrBlendPrefix, words[last], example)
		}
		return nil, fmt.Errorf("%w: %d words; write a weight before each prefix, %s", ErrBlendOdd, len(words), example)
	}
	parts := make([]BlendPart, 0, len(words)/2)
	sum := 0.0
	for i := 0; i < len(words); i += 2 {
		w, err := weight(i)
		if err != nil {
			return nil, err
		}
		if _, err := strconv.ParseFloat(words[i+1], 64); err == nil {
			return nil, fmt.Errorf("%w: weight %s (word %d) is followed by another number, %s; %s", ErrBlendPrefix, words[i], i+1, words[i+1], example)
		}
		parts = append(parts, BlendPart{Weight: w, Prefix: words[i+1]})
		sum += w
	}
	if sum == 0 {
		return nil, fmt.Errorf("%w: %q; give at least one dataset a positive weight", ErrBlendZero, s)
	}
	w := make([]float64, len(parts))
	for i, p := range parts {
		w[i] = p.Weight
	}
	normalise(w, sum)
	for i := range parts {
		parts[i].Weight = w[i]
	}
	return parts, nil
}

// Sampler is a source of numbered samples: a GPT split, or a Blend of
// them. It is what Dataset adapts to data.Source.
type Sampler interface {
	// Sample fills dst (Seq()+1 ids) with sample k of the run with this
	// seed.
	Sample(seed, k int64, dst []int32) error
	// SamplesPerEpoch is how many samples come before any repeats.
	SamplesPerEpoch() int64
	// Seq is the sequence length the samples are cut for.
	Seq() int
}

// scale is the fixed-point unit of a split's left share: shares are exact
// integers over 2^62, so prefix counts are exact integer arithmetic for
// every k below 2^62 and never drift with floating-point rounding.
const (
	scaleBits = 62
	maxBlendK = 1 << 62
)

// node is a two-way split of a blend's tree: of n samples reaching it,
// left(n) = floor(n*p/2^62 + 1/2) go left, the rest right. A child below 0
// is a part, ^child.
type node struct {
	p           uint64
	left, right int
}

// leftOf is how many of the first n samples reaching a split with share p
// go left: n*p rounded to nearest. It grows by 0 or 1 with n, so sample n
// goes left exactly when leftOf(n+1) > leftOf(n).
func leftOf(n, p uint64) uint64 {
	hi, lo := bits.Mul64(n, p)
	lo, c := bits.Add64(lo, 1<<(scaleBits-1), 0)
	hi += c
	return hi<<(64-scaleBits) | lo>>scaleBits
}

// Blend mixes several Samplers by weight, as Megatron's BlendedDataset
// does: sample k is dataset i's sample c, where c counts dataset i's
// earlier samples, so each dataset's samples are used in its own order
// 0, 1, 2, … and none repeats before that dataset's epoch ends.
//
// Megatron assigns samples greedily, each to the dataset furthest below its
// share so far; that needs every earlier sample to place sample k. Here the
// datasets are the leaves of a balanced binary tree and each inner node
// splits the samples reaching it between its two sides by the sides'
// weight ratio p, sending sample n left when round(n*p) steps up (a
// Beatty sequence). A dataset's count among the first k samples is
// therefore exact integer arithmetic down its path — O(log parts) for any
// k — and stays within about one sample of k times its weight for every
// prefix (within 1/2 for two datasets).
type Blend struct {
	parts   []Sampler
	weights []float64
	nodes   []node
	root    int
	seq     int
	samples int64
}

// NewBlend blends parts with weights (normalised here). The parts must cut
// windows of the same length; a part of weight zero is kept but never
// drawn.
func NewBlend(weights []float64, parts []Sampler) (*Blend, error) {
	if len(parts) == 0 {
		return nil, fmt.Errorf("%w: no datasets given", ErrBlendEmpty)
	}
	if len(weights) != len(parts) {
		return nil, fmt.Errorf("%w: %d weights for %d datasets; give one weight per dataset", ErrBlendParts, len(weights), len(parts))
	}
	sum := 0.0
	for i, w := range weights {
		if math.IsNaN(w) || math.IsInf(w, 0) {
			return nil, fmt.Errorf("%w: weight %d is %v", ErrBlendWeight, i+1, w)
		}
		if w < 0 {
			return nil, fmt.Errorf("%w: weight %d is %v; weights must be 0 or more", ErrBlendNegative, i+1, w)
		}
		sum += w
	}
	if sum == 0 {
		return nil, fmt.Errorf("%w: give at least one dataset a positive weight", ErrBlendZero)
	}
	b := &Blend{parts: parts, weights: slices.Clone(weights)}
	normalise(b.weights, sum)
	for i, p := range parts {
		if p == nil || p.SamplesPerEpoch() <= 0 {
			return nil, fmt.Errorf("%w: dataset %d has no samples", ErrBlendParts, i+1)
		}
		if i == 0 {
			b.seq = p.Seq()
		} else if p.Seq() != b.seq {
			return nil, fmt.Errorf("%w: dataset %d has samples of seq %d, dataset 1 of seq %d; build every dataset with the model's sequence length", ErrBlendParts, i+1, p.Seq(), b.seq)
		}
	}
	b.root = b.tree(0, len(parts))
	b.samples = b.epoch()
	return b, nil
}

// tree builds the splits of parts [a, b) and returns the index of its
// root (or ^a for one part).
func (b *Blend) tree(a, c int) int {
	if c-a == 1 {
		return ^a
	}
	mid := (a + c) / 2
	l, r := 0.0, 0.0
	for i := a; i < mid; i++ {
		l += b.weights[i]
	}
	for i := mid; i < c; i++ {
		r += b.weights[i]
	}
	var p uint64
	switch {
	case r == 0:
		p = 1 << scaleBits
	case l > 0:
		p = uint64(math.Round(l / (l + r) * (1 << scaleBits)))
	}
	n := node{p: p, left: b.tree(a, mid), right: b.tree(mid, c)}
	b.nodes = append(b.nodes, n)
	return len(b.nodes) - 1
}

// Pick is the dataset that global sample k comes from and that dataset's
// own sample number: how many of samples 0..k-1 it gave.
func (b *Blend) Pick(k int64) (part int, local int64, err error) {
	if k < 0 || k >= maxBlendK {
		return 0, 0, fmt.Errorf("%w: blend sample %d is outside [0, 2^62)", ErrSampleNumber, k)
	}
	n, at := uint64(k), b.root
	for at >= 0 {
		nd := b.nodes[at]
		l0 := leftOf(n, nd.p)
		if leftOf(n+1, nd.p) > l0 {
			n, at = l0, nd.left
		} else {
			n, at = n-l0, nd.right
		}
	}
	return ^at, int64(n), nil
}

// Counts is how many of the first n samples each dataset gives, for logs
// and for checking the mixture.
func (b *Blend) Counts(n int64) []int64 {
	out := make([]int64, len(b.parts))
	if n <= 0 {
		return out
	}
	n = min(n, maxBlendK)
	var walk func(at int, n uint64)
	walk = func(at int, n uint64) {
		if at < 0 {
			out[^at] = int64(n)
			return
		}
		nd := b.nodes[at]
		l := leftOf(n, nd.p)
		walk(nd.left, l)
		walk(nd.right, n-l)
	}
	walk(b.root, uint64(n))
	return out
}

// epoch is the number of blended samples before any dataset's samples
// would repeat: the largest n whose counts stay within every dataset's
// SamplesPerEpoch. Counts grow with n, so a doubling search and a binary
// search find it.
func (b *Blend) epoch() int64 {
	fits := func(n int64) bool {
		for i, c := range b.Counts(n) {
			if c > b.parts[i].SamplesPerEpoch() {
				return false
			}
		}
		return true
	}
	lo, hi := int64(1), int64(2)
	for hi < maxBlendK && fits(hi) {
		lo, hi = hi, hi*2
	}
	if hi >= maxBlendK && fits(maxBlendK) {
		return maxBlendK
	}
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		if fits(mid) {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo
}

// Sample fills dst with global sample k: the chosen dataset's own sample,
// drawn with the same seed.
func (b *Blend) Sample(seed, k int64, dst []int32) error {
	if b == nil {
		return fmt.Errorf("%w: no blend", ErrBlendEmpty)
	}
	i, local, err := b.Pick(k)
	if err != nil {
		return err
	}
	if err := b.parts[i].Sample(seed, local, dst); err != nil {
		return fmt.Errorf("blend dataset %d, its sample %d: %w", i+1, local, err)
	}
	return nil
}

// SamplesPerEpoch is how many blended samples come before any dataset
// repeats one of its samples: an evaluation pass over this many sees each
// held-out window at most once.
func (b *Blend) SamplesPerEpoch() int64 {
	if b == nil {
		return 0
	}
	return b.samples
}

// Seq is the sequence length shared by every dataset of the blend.
func (b *Blend) Seq() int {
	if b == nil {
		return 0
	}
	return b.seq
}

// Weights are the normalised weights, in the order of the datasets.
func (b *Blend) Weights() []float64 {
	if b == nil {
		return nil
	}
	return append([]float64(nil), b.weights...)
}
