package schedule

import (
	"fmt"
	"slices"
	"strings"
)

// Names lists the generators New knows, in the order the CLI documents them.
// It returns a fresh slice so callers cannot change what New accepts.
func Names() []string {
	return []string{"gpipe", "1f1b", "interleaved", "2bw", "zb"}
}

// New builds the named schedule. It is the single entry point for the CLI's
// --schedule flag, so every rule about which shapes a schedule accepts is
// enforced here or in the generator it dispatches to.
func New(name string, p, v, m int) (*Schedule, error) {
	if !slices.Contains(Names(), name) {
		return nil, fmt.Errorf("%w: unknown schedule %q: known schedules are %s", ErrConfig, name, strings.Join(Names(), ", "))
	}
	if err := checkShape(name, p, v, m); err != nil {
		return nil, err
	}
	if name != "interleaved" && v != 1 {
		return nil, fmt.Errorf("%w: --vpp > 1 only for interleaved: %s has one chunk a rank, got vpp=%d", ErrConfig, name, v)
	}
	switch name {
	case "gpipe":
		return GPipe(p, m)
	case "1f1b":
		return OneFOneB(p, m)
	case "2bw":
		return TwoBW(p, m)
	case "zb":
		return ZeroBubble(p, m)
	}
	return Interleaved(p, v, m)
}

func checkShape(name string, p, v, m int) error {
	if p < 1 || v < 1 || m < 1 {
		return fmt.Errorf("%w: pipeline ranks, chunks a rank and microbatches must all be ≥ 1: %s got pp=%d, vpp=%d, %d microbatches", ErrConfig, name, p, v, m)
	}
	return nil
}

// needMicro enforces m ≥ p for the 1F1B family: with fewer microbatches than
// ranks the warm-up never completes and the schedule degenerates to GPipe with
// a longer critical path, which is a configuration mistake, not a schedule.
func needMicro(name string, p, m int) error {
	if m < p {
		return fmt.Errorf("%w: %s over pp=%d ranks needs at least %d microbatches, got %d", ErrConfig, name, p, p, m)
	}
	return nil
}

// builder appends actions to per-rank lists and inserts the transfers that a
// compute action implies, so that generators only decide the compute order.
type builder struct {
	s *Schedule
}

func newBuilder(name string, p, v, m int, perRank int) *builder {
	s := &Schedule{Name: name, Ranks: p, Chunks: v, Micro: m, Actions: make([][]Action, p)}
	for r := range s.Actions {
		s.Actions[r] = make([]Action, 0, perRank)
	}
	return &builder{s: s}
}

// capacity estimates one rank's list length: F and B (and W when split) per
// local (chunk, micro), up to two transfers per F and per B, sync and opt.
func capacity(p, v, m int, split bool) int {
	per := 2
	if p > 1 {
		per += 4
	}
	if split {
		per++
	}
	return v*m*per + 2
}

// fwd appends F(j,k) on j's rank, preceded by the receive of its input and
// followed by the send of its output when the neighbour lives elsewhere.
func (b *builder) fwd(j, k int) {
	s := b.s
	r := s.RankOf(j)
	acts := s.Actions[r]
	if j > 0 {
		if prev := s.RankOf(j - 1); prev != r {
			acts = append(acts, Action{Kind: RecvF, Chunk: j, Micro: k, Peer: prev})
		}
	}
	acts = append(acts, Action{Kind: F, Chunk: j, Micro: k})
	if j+1 < s.numChunks() {
		if next := s.RankOf(j + 1); next != r {
			acts = append(acts, Action{Kind: SendF, Chunk: j, Micro: k, Peer: next})
		}
	}
	s.Actions[r] = acts
}

// bwd appends B(j,k), mirrored: receive the output gradient, run, send the
// input gradient.
func (b *builder) bwd(j, k int) {
	s := b.s
	r := s.RankOf(j)
	acts := s.Actions[r]
	if j+1 < s.numChunks() {
		if next := s.RankOf(j + 1); next != r {
			acts = append(acts, Action{Kind: RecvB, Chunk: j, Micro: k, Peer: next})
		}
	}
	acts = append(acts, Action{Kind: B, Chunk: j, Micro: k})
	if j > 0 {
		if prev := s.RankOf(j - 1); prev != r {
			acts = append(acts, Action{Kind: SendB, Chunk: j, Micro: k, Peer: prev})
		}
	}
	s.Actions[r] = acts
}

func (b *builder) weight(j, k int) {
	r := b.s.RankOf(j)
	b.s.Actions[r] = append(b.s.Actions[r], Action{Kind: W, Chunk: j, Micro: k})
}

// finish closes every rank's step with the gradient sync and optimizer step.
func (b *builder) finish() *Schedule {
	for r := range b.s.Actions {
		b.s.Actions[r] = append(b.s.Actions[r], Action{Kind: GradSync}, Action{Kind: Optim})
	}
	return b.s
}

// GPipe runs all m forwards, then all m backwards (in microbatch order) on
// every rank. Simple and deadlock-free, but every rank stashes all m
// microbatches' activations; the bubble is (p−1)/m as for 1F1B.
func GPipe(p, m int) (*Schedule, error) {
	if err := checkShape("gpipe", p, 1, m); err != nil {
		return nil, err
	}
	return oneF1B("gpipe", p, m, func(int) int { return m }), nil
}

// OneFOneB is PipeDream-flush: rank r runs p−1−r warm-up forwards, then
// alternates one forward and one backward, then drains the remaining
// backwards. Same bubble as GPipe, but at most p−r activations are stashed on
// rank r instead of m.
func OneFOneB(p, m int) (*Schedule, error) {
	if err := checkShape("1f1b", p, 1, m); err != nil {
		return nil, err
	}
	if err := needMicro("1f1b", p, m); err != nil {
		return nil, err
	}
	return oneF1B("1f1b", p, m, func(r int) int { return p - 1 - r }), nil
}

// TwoBW is PipeDream-2BW. Within one step its action order is 1F1B's; what
// differs is that the optimizer applies gradients to the weight version one
// step stale (two versions are kept), which is the runtime's concern. The
// paper updates weights every m ≥ p microbatches, hence the same m ≥ p rule.
func TwoBW(p, m int) (*Schedule, error) {
	if err := checkShape("2bw", p, 1, m); err != nil {
		return nil, err
	}
	if err := needMicro("2bw", p, m); err != nil {
		return nil, err
	}
	return oneF1B("2bw", p, m, func(r int) int { return p - 1 - r }), nil
}

// oneF1B is the shared shape of GPipe and 1F1B: warm(r) forwards, then
// forward/backward pairs, then the remaining backwards. GPipe is the case
// where the warm-up covers every microbatch.
func oneF1B(name string, p, m int, warm func(r int) int) *Schedule {
	b := newBuilder(name, p, 1, m, capacity(p, 1, m, false))
	for r := 0; r < p; r++ {
		w := min(warm(r), m)
		for k := 0; k < w; k++ {
			b.fwd(r, k)
		}
		for k := 0; k < m-w; k++ {
			b.fwd(r, w+k)
			b.bwd(r, k)
		}
		for k := m - w; k < m; k++ {
			b.bwd(r, k)
		}
	}
	return b.finish()
}

// Interleaved is Megatron-LM's interleaved 1F1B: each rank holds v chunks
// (chunk j on rank j mod p) and walks "virtual microbatches" in groups of p:
// microbatches g·p…g·p+p−1 through local chunk 0, then the same group
// through chunk 1, and so on; backwards visit the chunks in reverse. Rank r
// warms up with 2(p−1−r) + (v−1)·p forwards, then alternates, then drains.
// Each rank's bubble shrinks by v, to (p−1)/(v·m), for v times the
// point-to-point traffic; groups of p are why m % p must be 0.
//
// Megatron runs every forward first when m = p, a concession to its batched
// blocking send/recv pairs. With the buffered sends of this IR the general
// warm-up already reaches the same bubble and stashes less on the later
// ranks, so there is no special case.
func Interleaved(p, v, m int) (*Schedule, error) {
	const name = "interleaved"
	if err := checkShape(name, p, v, m); err != nil {
		return nil, err
	}
	if v == 1 {
		return nil, fmt.Errorf("%w: interleaved needs --vpp ≥ 2 chunks a rank, got 1 (use --schedule 1f1b for one chunk a rank)", ErrConfig)
	}
	if err := needMicro(name, p, m); err != nil {
		return nil, err
	}
	if m%p != 0 {
		return nil, fmt.Errorf("%w: interleaved needs microbatches a multiple of pp (they go through each chunk in groups of pp): %d microbatches, pp=%d", ErrConfig, m, p)
	}
	b := newBuilder(name, p, v, m, capacity(p, v, m, false))
	total := v * m
	group := p * v
	// virtual maps rank r's i-th forward (or backward) to (global chunk, micro).
	virtual := func(r, i int, backward bool) (int, int) {
		g, in := i/group, i%group
		c := in / p
		if backward {
			c = v - 1 - c
		}
		return c*p + r, g*p + in%p
	}
	for r := 0; r < p; r++ {
		warm := min(2*(p-1-r)+(v-1)*p, total)
		for i := 0; i < warm; i++ {
			b.fwd(virtual(r, i, false))
		}
		for i := 0; i < total-warm; i++ {
			b.fwd(virtual(r, warm+i, false))
			b.bwd(virtual(r, i, true))
		}
		for i := total - warm; i < total; i++ {
			b.bwd(virtual(r, i, true))
		}
	}
	return b.finish(), nil
}

// ZeroBubble is ZB-H1 from Qi et al. (2023). The backward is split into B
// (the input gradient, on the critical path between ranks) and W (the weight
// gradient, needed only by the optimizer). Rank r keeps 1F1B's warm-up of
// p−1−r forwards, so at most p−r activations are stashed as in 1F1B, but
// delays each W by r backwards: early on the B chain runs at F+B per
// microbatch, and the r deferred Ws fill the cool-down where 1F1B idles. With
// F = B = W the bubble drops from (p−1)(F+B+W) to (p−1)(F+B−W).
func ZeroBubble(p, m int) (*Schedule, error) {
	const name = "zb"
	if err := checkShape(name, p, 1, m); err != nil {
		return nil, err
	}
	if err := needMicro(name, p, m); err != nil {
		return nil, err
	}
	b := newBuilder(name, p, 1, m, capacity(p, 1, m, true))
	for r := 0; r < p; r++ {
		warm := min(p-1-r, m)
		for k := 0; k < warm; k++ {
			b.fwd(r, k)
		}
		nextW := 0
		for k := 0; k < m; k++ {
			if warm+k < m {
				b.fwd(r, warm+k)
			}
			b.bwd(r, k)
			if k >= r {
				b.weight(r, nextW)
				nextW++
			}
		}
		for ; nextW < m; nextW++ {
			b.weight(r, nextW)
		}
	}
	return b.finish(), nil
}
