package lower

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"gcompile/ir"
)

// What Options.Offload may name; "optimizer,params" offloads both.
const (
	OffloadOptimizer = "optimizer"
	OffloadParams    = "params"
)

// DefaultPrefetchLayers is the prefetch distance Options.PrefetchLayers 0
// selects: the copy for layer l+1's params is issued when layer l starts.
const DefaultPrefetchLayers = 1

// ParseOffload reads an offload list: "" or "none" (nothing), "optimizer"
// (optimizer state), "params" (parameters, with their low-precision copies
// under mixed precision and PipeDream-2BW's weight versions), or both,
// comma-separated, "optimizer,params".
func ParseOffload(s string) (optimizer, params bool, err error) {
	if s == "" || s == "none" {
		return false, false, nil
	}
	for _, part := range strings.Split(s, ",") {
		switch part {
		case OffloadOptimizer:
			if optimizer {
				return false, false, fmt.Errorf("%q is listed twice", part)
			}
			optimizer = true
		case OffloadParams:
			if params {
				return false, false, fmt.Errorf("%q is listed twice", part)
			}
			params = true
		default:
			return false, false, fmt.Errorf("want optimizer, params or optimizer,params (got %q)", part)
		}
	}
	return optimizer, params, nil
}

// prefetch is the distance in layer blocks Options asks for; 0 means a
// copy is issued right before its first use.
func (o Options) prefetch() int {
	switch {
	case o.PrefetchLayers == 0:
		return DefaultPrefetchLayers
	case o.PrefetchLayers < 0:
		return 0
	}
	return o.PrefetchLayers
}

// offload moves the buffers o names to the host arena (ZeRO-Offload's
// optimizer offload, ZeRO-Infinity's parameter offload) and stages each on
// the device only around its uses: a use window gets a device buffer, a
// copy from the host issued ahead of the window (prefetch), and, when the
// window writes the buffer, a copy back after its last use; the device
// buffer dies there. Windows follow the program's layer blocks (maximal
// runs of instructions of one layer and one phase), so a param has one
// window in its layer's forward, one in its backward and one in the
// optimizer: nothing stays on the device between forward and backward.
//
// The optimizer update runs on the device, on the param and state it
// copies in, and writes both back: what DeepSpeed does when only the
// params are offloaded (the step runs where the fp32 weights and state
// are, and the updated param returns to the host). With the optimizer
// offloaded too DeepSpeed steps on the CPU instead; here the update still
// runs on the device, for two reasons: kernels address device memory
// only, so the copy instruction stays the one place data crosses between
// host and device and a GPU backend runs the same program; and a host-side
// step would need a host copy of every gradient, so the host arena would
// grow by more than the offloaded bytes. Each update's tensors are on the
// device only from their prefetch to the update itself.
//
// Under mixed precision the low-precision copy of a param (the forward's
// cast of it) is offloaded the same way: it is made in the forward,
// copied to the host after the forward's uses and fetched again for the
// backward. So is a pipeline rank's received copy of another rank's param
// (the tied embedding on the last stage), and PipeDream-2BW's previous
// weight versions, which are state but are read like params.
func offload(p *Program, o Options) error {
	optimizer, params, err := ParseOffload(o.Offload)
	if err != nil {
		return fmt.Errorf("offload %q: %w", o.Offload, err)
	}
	if !optimizer && !params {
		return nil
	}
	dist := o.prefetch()
	block, blockStart := layerBlocks(p)
	uses := map[int][]int{}
	use := func(id, i int) {
		if id >= 0 && (len(uses[id]) == 0 || uses[id][len(uses[id])-1] != i) {
			uses[id] = append(uses[id], i)
		}
	}
	for i, in := range p.Instrs {
		for _, id := range in.Args {
			use(id, i)
		}
		use(in.Out, i)
	}
	outputs := map[int]bool{}
	for _, id := range p.Outputs {
		outputs[id] = true
	}
	home := map[int]bool{}
	var homes []int
	for id, b := range p.Buffers {
		if b.Host || !b.Kind.Persistent() {
			continue
		}
		if isWeight(b.Value) && params || b.Kind == State && !isWeight(b.Value) && optimizer {
			home[id] = true
			homes = append(homes, id)
		}
	}
	// Copies of a weight that live across windows: its low-precision cast
	// and a copy received from the rank that owns it. One produced and
	// consumed within a single window stays where it is.
	if params {
		for _, in := range p.Instrs {
			id := in.Out
			if id < 0 || home[id] || outputs[id] || p.Buffers[id].Kind != Temp || p.Buffers[id].Bytes == 0 {
				continue
			}
			if !isWeight(in.Value) && !(in.Op == "cast" && home[in.Args[0]]) {
				continue
			}
			if len(useWindows(p, uses[id], block, dist)) > 1 {
				home[id] = true
				homes = append(homes, id)
			}
		}
	}

	type insertion struct {
		gap   int // inserted before original instruction gap
		back  bool
		first int // the window's first use, to order copies in one gap
		in    Instr
	}
	var ins []insertion
	for _, h := range homes {
		b := p.Buffers[h]
		p.Buffers[h].Host = true
		prevEnd := -1
		for _, w := range useWindows(p, uses[h], block, dist) {
			f, e := w.uses[0], w.uses[len(w.uses)-1]
			if w.direct {
				prevEnd = e
				continue
			}
			s := len(p.Buffers)
			p.Buffers = append(p.Buffers, Buffer{ID: s, Kind: Temp, Name: b.Name, Type: b.Type, Global: b.Global, Place: b.Place, Bytes: b.Bytes, Value: b.Value})
			wrote := false
			for _, i := range w.uses {
				in := &p.Instrs[i]
				if in.Out == h {
					in.Out, wrote = s, true
				}
				for k, a := range in.Args {
					if a == h {
						in.Args[k] = s
					}
				}
			}
			// A window that starts by overwriting the whole buffer (the
			// cast or receive that makes a param's copy) needs no copy in.
			first := p.Instrs[f]
			if !(first.Out == s && !slices.Contains(first.Args, s)) {
				gap := f
				if dist > 0 {
					gap = blockStart[max(block[f]-dist, 0)]
				}
				gap = outsideBucket(p, max(gap, prevEnd+1))
				ins = append(ins, insertion{gap: gap, first: f, in: Instr{Op: "copy", Args: []int{h}, ArgTypes: []ir.Type{b.Type}, Out: s, OutType: b.Type, Value: b.Value}})
			}
			if wrote {
				ins = append(ins, insertion{gap: e + 1, back: true, first: f, in: Instr{Op: "copy", Args: []int{s}, ArgTypes: []ir.Type{b.Type}, Out: h, OutType: b.Type, Value: b.Value}})
			}
			prevEnd = e
		}
	}
	// In one gap, copies back to the host come first: they free device
	// memory, and a later window's copy in may read what they write.
	sort.SliceStable(ins, func(i, j int) bool {
		a, b := ins[i], ins[j]
		if a.gap != b.gap {
			return a.gap < b.gap
		}
		if a.back != b.back {
			return a.back
		}
		return a.first < b.first
	})
	out := make([]Instr, 0, len(p.Instrs)+len(ins))
	k := 0
	for g := 0; g <= len(p.Instrs); g++ {
		for ; k < len(ins) && ins[k].gap == g; k++ {
			in := ins[k].in
			// The copy runs within the schedule action around it.
			in.Block = p.Instrs[min(g, len(p.Instrs)-1)].Block
			if ins[k].back {
				in.Block = p.Instrs[g-1].Block
			}
			out = append(out, in)
		}
		if g < len(p.Instrs) {
			out = append(out, p.Instrs[g])
		}
	}
	p.Instrs = out
	return nil
}

// isWeight reports whether v holds weights the forward and backward read:
// a param, or a state initialised as a copy of one (PipeDream-2BW's
// previous version, which the forward reads instead of the param). Weight
// versions are offloaded with the params, not with the optimizer state.
func isWeight(v *ir.Value) bool {
	return v.Op == "param" || v.Op == "state" && strings.HasPrefix(v.Attrs.Str("init"), ir.InitCopyPrefix)
}

// window is a run of uses of one offloaded buffer that share a device
// copy. A direct window is a lone copy instruction (an update written at
// the end of the step, PipeDream-2BW's version copy): it moves the data
// between host and device itself and needs no staging.
type window struct {
	uses   []int
	direct bool
}

// useWindows groups a buffer's uses (instruction indices, ascending) into
// windows. A use joins the current window when its layer block is at most
// dist+1 blocks after the window's last one: its copy would otherwise be
// issued right as the window's device copy dies, so keeping that copy is
// free (DeepSpeed's max_reuse_distance plays the same role).
func useWindows(p *Program, uses, block []int, dist int) []window {
	var ws []window
	open := false
	for _, i := range uses {
		if p.Instrs[i].Op == "copy" {
			ws = append(ws, window{uses: []int{i}, direct: true})
			open = false
			continue
		}
		if open {
			w := &ws[len(ws)-1]
			if block[i]-block[w.uses[len(w.uses)-1]] <= dist+1 {
				w.uses = append(w.uses, i)
				continue
			}
		}
		ws = append(ws, window{uses: []int{i}})
		open = true
	}
	return ws
}

// layerBlocks numbers the program's layer blocks: maximal runs of
// instructions with the same layer and phase (recompute counts as the
// backward it serves). block[i] is instruction i's block, start[k] the
// first instruction of block k.
func layerBlocks(p *Program) (block, start []int) {
	phase := func(in Instr) ir.Phase {
		if in.Value.Meta.Phase == ir.PhaseRecompute {
			return ir.PhaseBwd
		}
		return in.Value.Meta.Phase
	}
	block = make([]int, len(p.Instrs))
	for i, in := range p.Instrs {
		if i == 0 || in.Value.Meta.Layer != p.Instrs[i-1].Value.Meta.Layer || phase(in) != phase(p.Instrs[i-1]) {
			start = append(start, i)
		}
		block[i] = len(start) - 1
	}
	return block, start
}

// LayerBlocks is how many layer blocks p has (maximal runs of one layer
// and one phase): the units --offload-prefetch counts in.
func LayerBlocks(p *Program) int {
	_, start := layerBlocks(p)
	return len(start)
}

// outsideBucket moves an insertion point that falls between two members
// of one gradient bucket to the bucket's start: the runtime reduces a
// bucket as one call over consecutive instructions.
func outsideBucket(p *Program, gap int) int {
	for gap > 0 && gap < len(p.Instrs) && p.Instrs[gap].Bucket > 0 && p.Instrs[gap-1].Bucket == p.Instrs[gap].Bucket {
		gap--
	}
	return gap
}
