package sample

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// maxSplitParts is Megatron's train, validation and test.
const maxSplitParts = 3

// ParseSplit reads a Megatron split string such as "98,2" or "969,30,1"
// (parts separated by commas, or by slashes as older Megatron accepted) and
// returns three weights normalised to sum to 1, padded with zeros as
// Megatron pads them. Part 0 is the training split and part 1 the held-out
// split used for evaluation; part 2, Megatron's test split, is parsed and
// kept in the result so that the ranges match Megatron's, but gcompile
// draws nothing from it.
//
// Megatron reads the numbers with a regular expression that skips minus
// signs and stray characters; here such input is refused with a named
// error instead, since a silently positive "-1" trains on the wrong split.
func ParseSplit(s string) ([]float64, error) {
	t := strings.TrimSpace(s)
	sep := ","
	if !strings.Contains(t, ",") && strings.Contains(t, "/") {
		sep = "/"
	}
	words := strings.Split(t, sep)
	if len(words) > maxSplitParts {
		return nil, fmt.Errorf("%w: %q has %d parts; give at most train,held-out,test, e.g. 98,2 or 969,30,1", ErrSplitParts, s, len(words))
	}
	w := make([]float64, maxSplitParts)
	sum := 0.0
	for i, word := range words {
		word = strings.TrimSpace(word)
		v, err := strconv.ParseFloat(word, 64)
		if errors.Is(err, strconv.ErrRange) || err == nil && math.IsInf(v, 0) {
			return nil, fmt.Errorf("%w: part %d of %q is %q, past a float64's range; shares are relative, so write smaller ones, e.g. 98,2", ErrSplitNotNumber, i+1, s, word)
		}
		if err != nil || math.IsNaN(v) {
			return nil, fmt.Errorf("%w: part %d of %q is %q; write numbers, e.g. 98,2", ErrSplitNotNumber, i+1, s, word)
		}
		if v < 0 {
			return nil, fmt.Errorf("%w: part %d of %q is %s; every part must be 0 or more, e.g. 98,2", ErrSplitNegative, i+1, s, word)
		}
		w[i] = v
		sum += v
	}
	if sum == 0 {
		return nil, fmt.Errorf("%w: %q; give the training part a positive weight, e.g. 98,2", ErrSplitZero, s)
	}
	normalise(w, sum)
	return w, nil
}

// SplitRanges cuts docs documents into one contiguous range [begin, end)
// per weight, rounded exactly as Megatron-LM's
// convert_split_vector_to_split_matrix and _build_megatron_dataset_splits
// round them: the weights are normalised, summed cumulatively in float64,
// and each bookend is int(round(cumulative * docs)) with Python's round,
// which rounds halves to even. A range whose weight is zero, which Megatron
// leaves without a dataset, comes back empty. Matching Megatron exactly
// keeps a dataset's held-out documents the same whichever of the two
// trains on it.
//
// The result never fails: weights that are negative, NaN or all zero give
// empty ranges (ParseSplit refuses them with a reason first), and a
// negative docs is taken as zero.
func SplitRanges(docs int, weights []float64) [][2]int {
	docs = max(docs, 0)
	out := make([][2]int, len(weights))
	sum := 0.0
	for _, w := range weights {
		if w > 0 && !math.IsInf(w, 0) {
			sum += w
		}
	}
	if !(sum > 0) || math.IsInf(sum, 0) {
		return out
	}
	// Weights that already sum to 1 (ParseSplit's) are used as they are:
	// dividing them again by a sum one unit in the last place off 1 would
	// move a bookend that Megatron, which normalises once, leaves alone.
	if math.Abs(sum-1) < 1e-9 {
		sum = 1
	}
	n := float64(docs)
	bookend := func(x float64) int {
		v := math.RoundToEven(x * n)
		return min(max(int(v), 0), docs)
	}
	cum := 0.0
	for i, w := range weights {
		if !(w > 0) || math.IsInf(w, 0) {
			w = 0
		}
		begin := cum
		if sum != 1 {
			w /= sum
		}
		cum += w
		b := bookend(begin)
		if cum <= begin {
			out[i] = [2]int{b, b}
			continue
		}
		out[i] = [2]int{b, max(bookend(cum), b)}
	}
	return out
}

// normalise divides w by its sum, scaling by the largest weight first when
// the sum overflowed, so that huge but finite weights still normalise.
func normalise(w []float64, sum float64) {
	if math.IsInf(sum, 0) {
		top := 0.0
		for _, v := range w {
			top = max(top, v)
		}
		sum = 0
		for i := range w {
			w[i] /= top
			sum += w[i]
		}
	}
	for i := range w {
		w[i] /= sum
	}
}
