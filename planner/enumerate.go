package planner

import (
	"fmt"
	"slices"

	"gcompile/compile"
	"gcompile/cost"
)

// enumerate lists the candidate configurations: every split of the
// devices into tp·pp·dp that the model's shape allows (tp divides heads,
// the MLP width and the vocabulary; pp·vpp divides the layers), every
// microbatch count that divides each replica's batch, and the memory
// options (ZeRO with dp > 1, sequence parallelism with tp > 1, recompute,
// optimizer offload). An axis the user fixed (Base.Explicit) takes only
// the user's value. tp stays within a node unless no split does.
// Validate, run by the caller, drops combinations the compiler refuses.
// For a model with experts, ep is searched too (every divisor of the
// experts that divides the devices, unless the user fixed it); it takes
// its share of the devices first, and the batch is split over dp·ep.
func enumerate(base compile.Config, t cost.Transformer, hw *cost.Hardware, selective bool) []compile.Config {
	fixed := func(name string) bool { return base.Explicit[name] }
	eps := []int{max(base.EP, 1)}
	if !fixed("ep") && t.Experts > 0 && t.MoELayers > 0 {
		eps = choices(false, 0, divisors(base.Devices), func(ep int) bool { return t.Experts%ep == 0 })
	}
	var out []compile.Config
	for _, ep := range eps {
		if base.Devices%ep != 0 {
			continue
		}
		for _, cp := range cpChoices(base, t, base.Devices/ep) {
			for _, impl := range cpImpls(base, t, cp) {
				b := base
				b.EP, b.CP, b.CPImpl = ep, cp, impl
				out = append(out, enumerateEP(b, t, hw, selective)...)
			}
		}
	}
	return out
}

// longSequence is the context from which the planner tries context
// parallelism, and minChunk the fewest tokens it leaves each cp rank:
// below them attention's s² is small next to the rest of a block and
// a chunk too small to keep a GPU busy.
const (
	longSequence = 8192
	minChunk     = 1024
)

// cpChoices are the context-parallel degrees searched within n devices:
// the user's; with --cp-impl or --cp-layout given, every divisor of n
// above 1 that divides the sequence; else, for a long sequence, every
// divisor of n that divides it and leaves each rank minChunk tokens or
// more.
func cpChoices(base compile.Config, t cost.Transformer, n int) []int {
	if base.Explicit["cp"] {
		return []int{max(base.CP, 1)}
	}
	if base.Explicit["cp-impl"] || base.Explicit["cp-layout"] {
		// The user asked for context parallelism without its degree:
		// every cp > 1 that splits the sequence, at any length.
		return choices(false, 0, divisors(n), func(cp int) bool { return cp > 1 && t.Seq%cp == 0 })
	}
	if t.Seq < longSequence {
		return []int{1}
	}
	return choices(false, 0, divisors(n), func(cp int) bool { return t.Seq%cp == 0 && t.Seq/cp >= minChunk })
}

// cpImpls are the attention strategies searched at cp: the user's, or
// the ring, and Ulysses where cp divides the heads and the k/v heads.
func cpImpls(base compile.Config, t cost.Transformer, cp int) []string {
	switch {
	case cp == 1:
		return []string{base.CPImpl}
	case base.Explicit["cp-impl"]:
		return []string{base.CPImpl}
	}
	impls := []string{"ring"}
	if kv := max(t.KVHeads, 0); t.Heads%cp == 0 && (kv == 0 || kv%cp == 0) {
		impls = append(impls, "all2all")
	}
	return impls
}

// enumerateEP is enumerate with ep fixed at base.EP.
func enumerateEP(base compile.Config, t cost.Transformer, hw *cost.Hardware, selective bool) []compile.Config {
	fixed := func(name string) bool { return base.Explicit[name] }
	ep, cp := max(base.EP, 1), max(base.CP, 1)
	n := base.Devices / (ep * cp)
	var out []compile.Config
	tps := choices(fixed("tp"), base.TP, divisors(n), func(tp int) bool {
		return t.Heads%tp == 0 && t.FFN%tp == 0 && t.Vocab%tp == 0
	})
	if !fixed("tp") {
		var inNode []int
		for _, tp := range tps {
			if tp <= hw.DevicesPerNode {
				inNode = append(inNode, tp)
			}
		}
		if len(inNode) > 0 {
			tps = inNode
		}
	}
	for _, tp := range tps {
		pps := choices(fixed("pp"), base.PP, divisors(n/max(tp, 1)), func(pp int) bool { return t.Layers%pp == 0 })
		for _, pp := range pps {
			if tp*pp == 0 || n%(tp*pp) != 0 {
				continue
			}
			dp := n / (tp * pp)
			if fixed("dp") && base.DP != dp {
				continue
			}
			if dp < 1 || base.Batch%(dp*ep) != 0 {
				continue
			}
			vpps := []int{1}
			if pp > 1 {
				vpps = choices(fixed("vpp"), base.VPP, upTo(maxVPP), func(v int) bool { return t.Layers%(pp*v) == 0 })
			} else if fixed("vpp") {
				vpps = []int{base.VPP}
			}
			ms := choices(fixed("microbatches"), base.Microbatches, divisors(base.Batch/(dp*ep)), func(m int) bool {
				return (pp == 1 && m <= 64 || pp > 1 && m >= pp) && m <= compile.MaxMicrobatches
			})
			if mbs := base.MicroBatchSize; mbs > 0 {
				// A pinned microbatch size leaves one count, or none.
				ms = slices.DeleteFunc(ms, func(m int) bool { return m*mbs*dp*ep != base.Batch })
				if len(ms) == 0 && !fixed("microbatches") && base.Batch%(dp*ep*mbs) == 0 {
					ms = []int{base.Batch / (dp * ep * mbs)}
				}
			}
			zeros := choices(fixed("zero"), base.Zero, []int{0, 1, 2, 3}, func(z int) bool { return z == 0 || dp > 1 })
			sps := []bool{false}
			if fixed("sequence-parallel") {
				sps = []bool{base.SequenceParallel}
			} else if tp > 1 && cp == 1 {
				// Under cp the sequence is split already, and tp's
				// split of it is not placed (docs/architecture.md).
				sps = []bool{false, true}
			}
			recomputes := []string{"none", "full"}
			if selective {
				recomputes = append(recomputes, "selective")
			}
			if fixed("recompute") {
				recomputes = []string{base.Recompute}
			}
			offloads := []string{"", "optimizer"}
			if fixed("offload") {
				offloads = []string{base.Offload}
			}
			for _, v := range vpps {
				rcs := recomputes
				if per := t.Layers / (pp * max(v, 1)); per >= 2 && !fixed("recompute") {
					// Megatron-LM's block method on half of each chunk's
					// layers: between none's memory and full's compute.
					rcs = append(slices.Clone(recomputes), fmt.Sprintf("block=%d", per/2))
				}
				for _, m := range ms {
					for _, z := range zeros {
						for _, sp := range sps {
							for _, rc := range rcs {
								for _, off := range offloads {
									c := base
									c.TP, c.PP, c.DP, c.VPP, c.Microbatches = tp, pp, dp, v, m
									c.Zero, c.SequenceParallel, c.Recompute, c.Offload = z, sp, rc, off
									if !fixed("schedule") {
										c.Schedule = ""
									}
									out = append(out, c)
								}
							}
						}
					}
				}
			}
		}
	}
	return out
}

// maxVPP bounds the virtual stages searched: every v up to it that
// divides a stage's layers (Megatron's rule; 3 chunks of one layer for
// 105 layers on 35 stages, as Korthikanti et al. ran 530B). Interleaving
// cuts the bubble by v but multiplies the pipeline transfers by v, so the
// gain from one more chunk shrinks as 1/v², and each value multiplies the
// candidates.
const maxVPP = 8

// choices is the user's value when fixed, else the allowed options.
func choices(fixed bool, value int, options []int, ok func(int) bool) []int {
	if fixed {
		return []int{value}
	}
	var out []int
	for _, o := range options {
		if ok(o) {
			out = append(out, o)
		}
	}
	return out
}

// divisors of n in increasing order.
func divisors(n int) []int {
	// Up to √n and their cofactors: a --batch of 10^11 (tokens typed for
	// sequences) took minutes counting to n.
	var lo, hi []int
	for i := 1; i <= n/i; i++ {
		if n%i == 0 {
			lo = append(lo, i)
			if i != n/i {
				hi = append(hi, n/i)
			}
		}
	}
	slices.Reverse(hi)
	return append(lo, hi...)
}

// upTo is 1..n.
func upTo(n int) []int {
	r := make([]int, n)
	for i := range r {
		r[i] = i + 1
	}
	return r
}
