package generate

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
)

// Sampling says how the next token is chosen from a step's logits.
//
// The zero value is not ready to use: TopP's "no limit" is 1, not 0, so
// that a nucleus of 0 (which would keep nothing) is refused by Validate
// rather than silently read as "off". Callers start from TopP = 1 and
// change the fields they are given.
type Sampling struct {
	// Temperature divides the logits before the softmax: below 1 it
	// sharpens the distribution, above 1 it flattens it. 0 is greedy:
	// the argmax, the lowest id on ties, with TopK, TopP and Seed ignored.
	Temperature float64
	// TopK keeps only the K most likely tokens, and any tied with the
	// K-th, as Hugging Face does; 0 is no limit.
	TopK int
	// TopP keeps only the nucleus: the most likely tokens, in order, up
	// to and including the one whose cumulative probability first reaches
	// TopP. 1 is no limit. It applies after TopK, to the probabilities of
	// the tokens TopK kept.
	TopP float64
	// Seed keys the random numbers: with the same seed, a sequence's
	// tokens are the same wherever and however it is run.
	Seed uint64
	// RepetitionPenalty makes the tokens a sequence already holds (its
	// prompt's and those generated) less likely, as Hugging Face's
	// RepetitionPenaltyLogitsProcessor does (Keskar et al.'s CTRL): each
	// one's logit is divided by it where positive and multiplied by it
	// where negative, before the temperature and the filters, greedy
	// included. Above 1 discourages repeats, below 1 encourages them; 0
	// and 1 are none.
	RepetitionPenalty float64
}

// maskedLogit is the logit at or below which a class is masked (padding
// classes of a vocabulary rounded up for the device): it gets probability
// exactly 0 and is never drawn, even where exp would not quite underflow.
const maskedLogit = -1e30

// nucleusSlack is how far below TopP a cumulative probability may fall
// and still count as reaching it, so that a nucleus that reaches TopP
// exactly on paper is not widened by one token through rounding.
const nucleusSlack = 1e-9

// Validate refuses settings Pick cannot honour, naming the flag each
// comes from and the rule it breaks, so that a command line can report
// them as they are.
func (s Sampling) Validate() error {
	var errs []error
	if !(s.Temperature >= 0) || math.IsInf(s.Temperature, 1) {
		errs = append(errs, fmt.Errorf("--temperature %v: want a temperature ≥ 0 (0: greedy)", s.Temperature))
	}
	if s.TopK < 0 {
		errs = append(errs, fmt.Errorf("--top-k %d: want k ≥ 0 (0: no limit)", s.TopK))
	}
	if !(s.TopP > 0 && s.TopP <= 1) {
		errs = append(errs, fmt.Errorf("--top-p %v: want 0 < p ≤ 1 (1: no limit)", s.TopP))
	}
	if !(s.RepetitionPenalty >= 0) || math.IsInf(s.RepetitionPenalty, 1) {
		errs = append(errs, fmt.Errorf("--repetition-penalty %v: want a finite penalty > 0 (1: none)", s.RepetitionPenalty))
	}
	return errors.Join(errs...)
}

// Penalize returns logits with RepetitionPenalty applied to the ids of
// seen (each once, however often it occurs), or logits itself when there
// is no penalty. Masked and NaN logits stay as they are: a penalty below 1
// must not lift a padding class above the mask.
func (s Sampling) Penalize(logits []float64, seen []int32) []float64 {
	r := s.RepetitionPenalty
	if r == 0 || r == 1 || len(seen) == 0 {
		return logits
	}
	out := slices.Clone(logits)
	done := make(map[int32]bool, len(seen))
	for _, id := range seen {
		if done[id] || id < 0 || int(id) >= len(out) {
			continue
		}
		done[id] = true
		switch x := out[id]; {
		case !(x > maskedLogit):
		case x < 0:
			out[id] = x * r
		default:
			out[id] = x / r
		}
	}
	return out
}

// Pick chooses the next token of sequence seq at step step from its
// logits, one per vocabulary entry.
//
// Pick is a pure function of its receiver and arguments: the random
// number behind a draw is derived from (Seed, seq, step) by a counter-based
// hash, not taken from a generator whose state depends on earlier draws.
// A sequence therefore gets the same tokens on any machine and in any
// process, whichever batch it falls in and whatever order the sequences
// of a step are sampled in.
//
// With Temperature 0 Pick returns the argmax (the lowest id among equal
// maxima). Otherwise:
//   - Tokens are ranked by logit, highest first, ties by lower id.
//   - TopK > 0 keeps the first TopK of that ranking, and every token tied
//     with the TopK-th (HF's TopKLogitsWarper removes only logits below
//     the K-th largest).
//   - The kept tokens' probabilities are softmax(logit/Temperature).
//   - TopP < 1 keeps the nucleus, as Hugging Face's TopPLogitsWarper does:
//     in ranking order, a token is kept while the probability of the
//     tokens ranked before it is below TopP, so the token whose cumulative
//     probability first reaches TopP is the last kept, and the most likely
//     token is always kept. (HF removes the tokens whose ascending
//     cumulative probability is ≤ 1−TopP: the same set.) "Reaches" allows
//     for rounding: within 1e-9 of TopP counts.
//   - The token is drawn from the kept set, renormalised, by inverse CDF
//     over the kept ids in increasing order. Drawing in id order rather
//     than ranking order means a filter that keeps every token (TopK at
//     least the vocabulary, TopP 1) picks exactly what no filter picks.
//
// Masked logits (≤ -1e30 or -Inf) have probability exactly 0 and NaN
// logits count as -Inf, so neither is ever drawn. If some logits are +Inf,
// they share all the probability equally. If every logit is masked or
// NaN, nothing can be drawn and Pick falls back to the argmax, which is
// deterministic (the lowest id when all are NaN).
//
// Pick expects a Sampling that Validate accepts, and reads others
// leniently: a temperature that is not above 0 is greedy, a TopK below 0
// or a TopP outside (0, 1) is no limit. It panics on empty logits, which
// no vocabulary has.
func (s Sampling) Pick(logits []float64, seq, step int) int {
	if len(logits) == 0 {
		panic("generate: Pick over empty logits")
	}
	t := s.Temperature
	if !(t > 0) {
		return argmax(logits)
	}
	top, n := math.Inf(-1), 0
	for _, x := range logits {
		if x > maskedLogit {
			n++
			top = max(top, x)
		}
	}
	if n == 0 {
		return argmax(logits)
	}
	if math.IsInf(top, 1) {
		// exp((x−top)/t) is NaN or 0 for every token: the limit of the
		// softmax is uniform over the +Inf entries, so weigh just those.
		logits, top, n = onlyInfinite(logits)
	}
	u := uniform(s.Seed, seq, step)
	k := s.TopK
	if k <= 0 || k >= n {
		k = 0
	}
	p := s.TopP
	if !(p > 0 && p < 1) {
		p = 0
	}
	w := weigher{logits, top, t}
	switch {
	case k == 0 && p == 0:
		return w.drawAll(u)
	case k > 0:
		kept := withTies(logits, ranked(logits, k, n))
		if p > 0 {
			kept = w.nucleus(kept, w.sum(kept), p)
		}
		slices.Sort(kept)
		return w.draw(kept, u)
	default:
		kept := w.nucleusAll(n, p)
		slices.Sort(kept)
		return w.draw(kept, u)
	}
}

// argmax is the index of the largest logit, the lowest among equals, with
// NaN below everything; 0 when all are NaN.
func argmax(logits []float64) int {
	best := -1
	for i, x := range logits {
		if x == x && (best < 0 || x > logits[best]) {
			best = i
		}
	}
	return max(best, 0)
}

// onlyInfinite returns logits with the +Inf entries at 0 and all others
// masked, their maximum (0) and how many there are.
func onlyInfinite(logits []float64) ([]float64, float64, int) {
	out := make([]float64, len(logits))
	n := 0
	for i, x := range logits {
		out[i] = math.Inf(-1)
		if math.IsInf(x, 1) {
			out[i] = 0
			n++
		}
	}
	return out, 0, n
}

// weigher turns logits into unnormalised probabilities
// exp((x−top)/t): subtracting the maximum before dividing keeps every
// weight in [0, 1] whatever the temperature, and the maximum's weight at
// exactly 1.
type weigher struct {
	logits []float64
	top, t float64
}

func (w weigher) of(i int) float64 {
	x := w.logits[i]
	if !(x > maskedLogit) {
		return 0
	}
	return math.Exp((x - w.top) / w.t)
}

func (w weigher) sum(ids []int) float64 {
	z := 0.0
	for _, i := range ids {
		z += w.of(i)
	}
	return z
}

// drawAll draws over the whole vocabulary in id order without building
// a candidate list: the unfiltered case touches each logit twice at most
// and allocates nothing.
func (w weigher) drawAll(u float64) int {
	z := 0.0
	for i := range w.logits {
		z += w.of(i)
	}
	target, cum, last := u*z, 0.0, -1
	for i := range w.logits {
		if wi := w.of(i); wi > 0 {
			cum += wi
			last = i
			if cum > target {
				return i
			}
		}
	}
	// u·z rounded up to z: the last token with any weight.
	return last
}

// draw draws over ids (increasing) by inverse CDF. The cumulative sum is
// taken in the order the total was, so it ends at the total exactly and
// only rounding of u·z can run past it. A token of weight 0 is never
// returned: it cannot be the first to pass the target.
func (w weigher) draw(ids []int, u float64) int {
	target, cum, last := u*w.sum(ids), 0.0, ids[0]
	for _, i := range ids {
		if wi := w.of(i); wi > 0 {
			cum += wi
			last = i
			if cum > target {
				return i
			}
		}
	}
	return last
}

// nucleus is the prefix of ids (ranked, highest first, of total weight z)
// whose last token is the first to bring the cumulative probability to p
// (all of ids if rounding keeps the sum short of it).
func (w weigher) nucleus(ids []int, z, p float64) []int {
	need := (p - nucleusSlack) * z
	cum := 0.0
	for j, i := range ids {
		cum += w.of(i)
		if cum >= need {
			return ids[:j+1]
		}
	}
	return ids
}

// nucleusAll finds the nucleus over all n usable tokens without ranking
// them all: a quickselect on probability mass. Each round splits the
// undecided tokens around a pivot in ranking order; if the tokens above the
// pivot reach p, the end of the nucleus lies among them, otherwise they
// (and perhaps the pivot) are all kept and the search goes on below. That
// is linear in the vocabulary on average, where a nucleus of thousands of
// tokens would otherwise mean sorting most of it. Only the last few
// undecided tokens are sorted, to find the one that reaches p.
func (w weigher) nucleusAll(n int, p float64) []int {
	items := make([]weighted, 0, n)
	z := 0.0
	for i, x := range w.logits {
		if x > maskedLogit {
			wi := w.of(i)
			items = append(items, weighted{i, x, wi})
			z += wi
		}
	}
	need := (p - nucleusSlack) * z
	// items[:lo] are kept, of mass got; the end of the nucleus is in
	// items[lo:hi]; items[hi:] rank below it.
	lo, hi, got := 0, len(items), 0.0
	var end int
	for {
		if hi-lo <= 16 {
			r := items[lo:hi]
			slices.SortFunc(r, func(a, b weighted) int {
				if a.before(b) {
					return -1
				}
				return 1
			})
			end = hi
			for j, it := range r {
				got += it.w
				if got >= need {
					end = lo + j + 1
					break
				}
			}
			break
		}
		m, above := partition(items[lo:hi])
		m += lo
		if got+above >= need {
			hi = m
			continue
		}
		got += above + items[m].w
		if got >= need {
			end = m + 1
			break
		}
		lo = m + 1
	}
	ids := make([]int, end)
	for j, it := range items[:end] {
		ids[j] = it.id
	}
	return ids
}

// weighted is a token with its logit (never NaN: only usable tokens are
// ranked) and unnormalised probability, kept together so that ranking and
// summing read one array.
type weighted struct {
	id    int
	logit float64
	w     float64
}

// before reports whether a ranks before b: a larger logit, or an equal
// one and a lower id.
func (a weighted) before(b weighted) bool {
	return a.logit > b.logit || a.logit == b.logit && a.id < b.id
}

// partition reorders r so that the tokens ranking above a pivot come
// first, then the pivot, then the rest, and returns the pivot's index and
// the mass of the tokens above it. The pivot is the median of the first,
// middle and last tokens, so input already in or against ranking order
// does not make the selection quadratic.
func partition(r []weighted) (int, float64) {
	last := len(r) - 1
	a, b, c := 0, last/2, last
	if r[b].before(r[a]) {
		a, b = b, a
	}
	if r[c].before(r[b]) {
		b, c = c, b
		if r[b].before(r[a]) {
			b = a
		}
	}
	r[b], r[last] = r[last], r[b]
	pivot := r[last]
	store, above := 0, 0.0
	for j := range last {
		if r[j].before(pivot) {
			above += r[j].w
			r[j], r[store] = r[store], r[j]
			store++
		}
	}
	r[store], r[last] = r[last], r[store]
	return store, above
}

// ranked returns the first k of the n usable tokens in ranking order
// (logit descending, lower id first on ties), all n when k ≥ n. Below n it
// keeps a heap of the k best seen so far, O(V log k) rather than a sort of
// the vocabulary.
func ranked(logits []float64, k, n int) []int {
	if k >= n {
		ids := make([]int, 0, n)
		for i, x := range logits {
			if x > maskedLogit {
				ids = append(ids, i)
			}
		}
		sortRanked(logits, ids)
		return ids
	}
	h := selection{logits: logits, ids: make([]int, 0, k)}
	for i, x := range logits {
		if !(x > maskedLogit) {
			continue
		}
		if len(h.ids) < k {
			h.ids = append(h.ids, i)
			h.up(len(h.ids) - 1)
			continue
		}
		// Ids arrive in increasing order, so a tie with the worst kept
		// token ranks below it: only a strictly larger logit replaces it.
		if x > logits[h.ids[0]] {
			h.ids[0] = i
			h.down(0)
		}
	}
	sortRanked(logits, h.ids)
	return h.ids
}

// withTies adds to the first k of the ranking (kept, in ranking order)
// every other token whose logit equals the k-th's, in ranking order after
// it: Hugging Face's TopKLogitsWarper removes only the logits below the
// k-th largest, so a tie at the cut keeps all the tied tokens.
func withTies(logits []float64, kept []int) []int {
	if len(kept) == 0 {
		return kept
	}
	last := logits[kept[len(kept)-1]]
	in := make(map[int]bool, len(kept))
	for _, i := range kept {
		in[i] = true
	}
	for i, x := range logits {
		if x == last && !in[i] {
			kept = append(kept, i) // ids increase: the ranking's order among equals
		}
	}
	return kept
}

func sortRanked(logits []float64, ids []int) {
	slices.SortFunc(ids, func(a, b int) int {
		if c := cmp.Compare(logits[b], logits[a]); c != 0 {
			return c
		}
		return cmp.Compare(a, b)
	})
}

// selection is a heap of token ids whose root is the lowest-ranked one.
type selection struct {
	logits []float64
	ids    []int
}

// below reports whether token a ranks below token b.
func (h *selection) below(a, b int) bool {
	x, y := h.logits[a], h.logits[b]
	return x < y || x == y && a > b
}

func (h *selection) up(j int) {
	for j > 0 {
		parent := (j - 1) / 2
		if !h.below(h.ids[j], h.ids[parent]) {
			return
		}
		h.ids[j], h.ids[parent] = h.ids[parent], h.ids[j]
		j = parent
	}
}

func (h *selection) down(j int) {
	n := len(h.ids)
	for {
		low := j
		for _, c := range [2]int{2*j + 1, 2*j + 2} {
			if c < n && h.below(h.ids[c], h.ids[low]) {
				low = c
			}
		}
		if low == j {
			return
		}
		h.ids[j], h.ids[low] = h.ids[low], h.ids[j]
		j = low
	}
}

// uniform is the random number of one draw, in [0, 1) with 53 random
// bits. It is a hash of (seed, seq, step) with splitmix64's finaliser, a
// bijection on 64 bits that mixes every input bit into every output bit:
// nearby keys (step and step+1) give unrelated numbers, and no state
// carries from one draw to the next.
func uniform(seed uint64, seq, step int) float64 {
	h := splitmix(seed)
	h = splitmix(h ^ uint64(seq))
	h = splitmix(h ^ uint64(step))
	return float64(h>>11) * 0x1p-53
}

func splitmix(z uint64) uint64 {
	z += 0x9e3779b97f4a7c15
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}
