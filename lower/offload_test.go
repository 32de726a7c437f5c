package lower_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/examples/gpt"
	"gcompile/frontend"
	"gcompile/ir"
	"gcompile/lower"
	"gcompile/passes"
)

const offloadLayers = 4

// offloadModule is a four-layer GPT after every pass, so there are layers
// both ahead of and behind each layer to prefetch across.
func offloadModule(t *testing.T, precision string) *ir.Module {
	t.Helper()
	m, err := frontend.Build(gpt.Model, frontend.Config{Name: "gpt", Batch: 2, Set: map[string]string{"layers": fmt.Sprint(offloadLayers), "hidden": "32", "heads": "4", "seq": "16"}})
	require.NoError(t, err)
	opts := passes.DefaultOptions()
	opts.Precision = precision
	_, err = passes.Run(m, opts, passes.Hooks{})
	require.NoError(t, err)
	return m
}

func lowerWith(t *testing.T, m *ir.Module, o lower.Options) *lower.Program {
	t.Helper()
	p, err := lower.LowerWith(m, o)
	require.NoError(t, err)
	return p
}

func TestParseOffload(t *testing.T) {
	tests := []struct {
		in                string
		optimizer, params bool
		err               string
	}{
		{in: ""},
		{in: "none"},
		{in: "optimizer", optimizer: true},
		{in: "params", params: true},
		{in: "optimizer,params", optimizer: true, params: true},
		{in: "params,optimizer", optimizer: true, params: true},
		{in: "disk", err: `want optimizer, params or optimizer,params (got "disk")`},
		{in: "params,", err: `(got "")`},
		{in: "all", err: `(got "all")`},
		{in: "params,params", err: `"params" is listed twice`},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			opt, par, err := lower.ParseOffload(tt.in)
			if tt.err != "" {
				assert.ErrorContains(t, err, tt.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.optimizer, opt, "optimizer")
			assert.Equal(t, tt.params, par, "params")
		})
	}
	_, err := lower.LowerWith(ir.NewModule("t"), lower.Options{Offload: "disk"})
	assert.ErrorContains(t, err, `offload "disk": want optimizer`)
}

// staged is a device buffer that holds an offloaded buffer's value for
// one use window: from its copy in (or, for a copy the program makes, its
// first write) to its last use (a read, or its copy back to the host).
type staged struct {
	buf, home int
	from, to  int
	copyIn    int // the copy from the host, -1 if none
	copyBack  bool
	uses      []int // instructions other than the staging copies
}

// isStagingCopy tells the copies offload adds (host↔device copies of one
// value) from the program's own copies (an update's new value into its
// state).
func isStagingCopy(p *lower.Program, in lower.Instr) bool {
	if in.Op != "copy" {
		return false
	}
	a, o := p.Buffers[in.Args[0]], p.Buffers[in.Out]
	return a.Value == o.Value && a.Host != o.Host
}

func stagedBuffers(p *lower.Program) map[int]*staged {
	out := map[int]*staged{}
	get := func(buf, home int) *staged {
		if out[buf] == nil {
			out[buf] = &staged{buf: buf, home: home, from: -1, copyIn: -1}
		}
		return out[buf]
	}
	for i, in := range p.Instrs {
		if !isStagingCopy(p, in) {
			continue
		}
		if p.Buffers[in.Out].Host {
			get(in.Args[0], in.Out).copyBack = true
		} else {
			s := get(in.Out, in.Args[0])
			s.copyIn = i
		}
	}
	for i, in := range p.Instrs {
		for _, b := range append(append([]int(nil), in.Args...), in.Out) {
			s := out[b]
			if s == nil {
				continue
			}
			if s.from < 0 {
				s.from = i
			}
			s.to = i
			if !isStagingCopy(p, in) && (len(s.uses) == 0 || s.uses[len(s.uses)-1] != i) {
				s.uses = append(s.uses, i)
			}
		}
	}
	return out
}

// blocksOf numbers the layer blocks of the program's own instructions
// (staging copies left out): runs of one layer in one phase, recompute
// counted with the backward.
func blocksOf(p *lower.Program) map[int]int {
	block := map[int]int{}
	k, prev := -1, ""
	for i, in := range p.Instrs {
		if isStagingCopy(p, in) {
			continue
		}
		ph := in.Value.Meta.Phase
		if ph == ir.PhaseRecompute {
			ph = ir.PhaseBwd
		}
		key := fmt.Sprintf("%d/%v", in.Value.Meta.Layer, ph)
		if key != prev {
			k, prev = k+1, key
		}
		block[i] = k
	}
	return block
}

// nextOwn is the first instruction at or after i that is not a staging copy.
func nextOwn(p *lower.Program, i int) int {
	for isStagingCopy(p, p.Instrs[i]) {
		i++
	}
	return i
}

// prevOwn is the last instruction before i that is not a staging copy, or -1.
func prevOwn(p *lower.Program, i int) int {
	for i--; i >= 0 && isStagingCopy(p, p.Instrs[i]); i-- {
	}
	return i
}

func layerOf(name string) int {
	var l int
	if _, err := fmt.Sscanf(name, "h.%d.", &l); err != nil {
		return -1
	}
	return l
}

// With params offloaded every param lives on the host; a layer's param is
// on the device in one window per phase that reads it — its layer's
// forward, its layer's backward (weights, not biases), its update — and
// never between the forward and the backward.
func TestOffloadParamsUseWindows(t *testing.T) {
	m := offloadModule(t, "")
	ref := lowerWith(t, m, lower.Options{})
	p := lowerWith(t, m, lower.Options{Offload: "params"})
	var params int64
	for _, b := range p.Buffers {
		if b.Kind == lower.Param {
			assert.True(t, b.Host, "%s lives on the host", b.Name)
			params += b.Bytes
		}
	}
	assert.Equal(t, params, p.HostBytes, "the host arena holds exactly the params")
	assert.Equal(t, ref.PersistentBytes-params, p.PersistentBytes, "the device holds no param between uses")
	windows := map[string][]*staged{}
	for _, s := range stagedBuffers(p) {
		windows[p.Buffers[s.home].Name] = append(windows[p.Buffers[s.home].Name], s)
	}
	for _, b := range p.Buffers {
		if b.Kind != lower.Param || layerOf(b.Name) < 0 {
			continue
		}
		readIn := map[ir.Phase]bool{}
		for _, in := range ref.Instrs {
			for _, a := range in.Args {
				if a == ref.Sources[b.Name] {
					readIn[in.Value.Meta.Phase] = true
				}
			}
		}
		ws := windows[b.Name]
		require.Len(t, ws, len(readIn), "%s: one window per phase that reads it", b.Name)
		phases := map[ir.Phase]bool{}
		for _, w := range ws {
			require.GreaterOrEqual(t, w.copyIn, 0, "%s is copied in before each window", b.Name)
			ph := p.Instrs[w.uses[0]].Value.Meta.Phase
			for _, u := range w.uses {
				assert.Equal(t, ph, p.Instrs[u].Value.Meta.Phase, "%s: one window serves one phase", b.Name)
				assert.Equal(t, layerOf(b.Name), p.Instrs[u].Value.Meta.Layer, "%s is used in its own layer", b.Name)
			}
			phases[ph] = true
			assert.Equal(t, ph == ir.PhaseOpt, w.copyBack, "%s: only the update writes the param back", b.Name)
		}
		assert.Equal(t, readIn, phases, b.Name)
	}
	// ForwardEnd still ends at the loss once copies are inserted.
	assert.Equal(t, p.Outputs["loss"], p.Instrs[p.ForwardEnd-1].Out)
}

// The copy for a window is issued exactly PrefetchLayers layer blocks
// before the window's first use (layer l+d's params when layer l starts),
// uses less than d+2 blocks apart share a window, and a longer distance
// never lowers the peak.
func TestOffloadPrefetchDistance(t *testing.T) {
	m := offloadModule(t, "")
	var prevPeak int64
	for _, d := range []int{-1, 1, 2, 3} {
		t.Run(fmt.Sprintf("prefetch%d", d), func(t *testing.T) {
			p := lowerWith(t, m, lower.Options{Offload: "params", PrefetchLayers: d})
			block := blocksOf(p)
			dist := max(d, 0)
			byHome := map[int][]*staged{}
			for _, s := range stagedBuffers(p) {
				byHome[s.home] = append(byHome[s.home], s)
			}
			for home, ws := range byHome {
				name := p.Buffers[home].Name
				for _, w := range ws {
					for k := 1; k < len(w.uses); k++ {
						assert.LessOrEqual(t, block[w.uses[k]]-block[w.uses[k-1]], dist+1, "%s: uses within reach of the prefetch share a window", name)
					}
					require.GreaterOrEqual(t, w.copyIn, 0, "%s: a param's every window is copied in", name)
					next := nextOwn(p, w.copyIn)
					if d < 0 {
						assert.Equal(t, w.uses[0], next, "%s: without prefetch the copy comes right before its use", name)
						continue
					}
					ahead := block[w.uses[0]] - block[next]
					assert.Equal(t, min(dist, block[w.uses[0]]), ahead, "%s: copied %d blocks ahead", name, ahead)
					if prev := prevOwn(p, next); prev >= 0 {
						assert.NotEqual(t, block[prev], block[next], "%s: the copy is issued as a block starts", name)
					}
				}
				// Separate windows of one buffer are more than d+1 blocks apart.
				for i, a := range ws {
					for _, b := range ws[i+1:] {
						first, second := a, b
						if b.from < a.from {
							first, second = b, a
						}
						assert.Greater(t, block[second.uses[0]]-block[first.uses[len(first.uses)-1]], dist+1, "%s: windows this close would have merged", name)
					}
				}
			}
			// In the forward, layer l's params arrive when layer l−d starts.
			for _, s := range stagedBuffers(p) {
				l := layerOf(p.Buffers[s.home].Name)
				first := p.Instrs[s.uses[0]].Value.Meta
				if d < 1 || l < d || first.Phase != ir.PhaseFwd {
					continue
				}
				at := p.Instrs[nextOwn(p, s.copyIn)].Value.Meta
				assert.Equal(t, l-d, at.Layer, "%s is fetched when layer %d's forward starts", p.Buffers[s.home].Name, l-d)
				assert.Equal(t, ir.PhaseFwd, at.Phase)
			}
			assert.GreaterOrEqual(t, p.PeakBytes, prevPeak, "a longer prefetch distance keeps more on the device")
			prevPeak = p.PeakBytes
			t.Logf("prefetch %d: peak %d bytes, %d instructions", d, p.PeakBytes, len(p.Instrs))
		})
	}
}

// deviceLive is, per instruction, the bytes of device temporaries live
// there (written at or before it, read at or after it; outputs live to
// the end of the step).
func deviceLive(p *lower.Program) []int64 {
	first, last := map[int]int{}, map[int]int{}
	touch := func(b, i int) {
		if b < 0 || p.Buffers[b].Host || p.Buffers[b].Kind.Persistent() {
			return
		}
		if _, ok := first[b]; !ok {
			first[b] = i
		}
		last[b] = i
	}
	for i, in := range p.Instrs {
		touch(in.Out, i)
		for _, a := range in.Args {
			touch(a, i)
		}
	}
	for _, b := range p.Outputs {
		if _, ok := last[b]; ok {
			last[b] = len(p.Instrs) - 1
		}
	}
	live := make([]int64, len(p.Instrs))
	for b, f := range first {
		for i := f; i <= last[b]; i++ {
			live[i] += p.Buffers[b].Bytes
		}
	}
	return live
}

// The device peak with offload is derived from the program without it:
// the params and state leave the persistent part, and at each instruction
// the staged copies whose window covers it come back. The planner's
// predicted peak equals that figure exactly, and the breakdown at the peak
// shows exactly the params and state in their windows there.
func TestOffloadPeakIsDerivedExactly(t *testing.T) {
	for _, tt := range []struct{ precision, offload string }{
		{"", "optimizer"}, {"", "params"}, {"", "optimizer,params"}, {"bf16", "params"}, {"bf16", "optimizer,params"},
	} {
		t.Run(tt.precision+tt.offload, func(t *testing.T) {
			m := offloadModule(t, tt.precision)
			ref := lowerWith(t, m, lower.Options{})
			p := lowerWith(t, m, lower.Options{Offload: tt.offload})
			var offloaded, hostTemps int64
			for _, b := range p.Buffers {
				if b.Host && b.Kind.Persistent() {
					offloaded += b.Bytes
				}
				if b.Host && !b.Kind.Persistent() {
					hostTemps += b.Bytes
				}
			}
			assert.Equal(t, offloaded+hostTemps, p.HostBytes, "the host arena holds exactly what was offloaded")
			// The program's own instructions, in order, are the reference's.
			refLive, live := deviceLive(ref), deviceLive(p)
			staging := stagedBuffers(p)
			stagedLive := func(i int, want func(lower.Buffer) bool) int64 {
				var n int64
				for _, s := range staging {
					if s.from <= i && i <= s.to && want(p.Buffers[s.home]) {
						n += p.Buffers[s.buf].Bytes
					}
				}
				return n
			}
			all := func(lower.Buffer) bool { return true }
			j, best := 0, int64(-1)
			for i, in := range p.Instrs {
				if isStagingCopy(p, in) {
					continue
				}
				require.Less(t, j, len(ref.Instrs))
				require.Equal(t, ref.Instrs[j].Value, in.Value, "instruction %d is the reference's %d", i, j)
				// Host copies of a param's cast are temporaries of the
				// reference; they are the staged bytes here.
				want := refLive[j] - hostTempsLive(ref, p, j) + stagedLive(i, all)
				assert.Equal(t, want, live[i], "instruction %d (%s)", i, in.Value.Where())
				best = max(best, want)
				j++
			}
			require.Equal(t, len(ref.Instrs), j)
			wantPeak := ref.PersistentBytes - offloaded + best
			assert.Equal(t, wantPeak, p.PeakBytes, "predicted peak")
			assert.Equal(t, ref.PersistentBytes-offloaded, p.PersistentBytes)
			bd := p.Peak
			assert.Equal(t, p.PeakBytes, bd.Params+bd.Gradients+bd.Optimizer+bd.Activations+bd.Inputs+bd.Workspace, "breakdown sums to the peak")
			isParam := func(b lower.Buffer) bool { return b.Kind == lower.Param }
			isState := func(b lower.Buffer) bool { return b.Kind == lower.State }
			var devParams, devState int64
			for _, b := range p.Buffers {
				if !b.Host && b.Kind == lower.Param {
					devParams += b.Bytes
				}
				if !b.Host && b.Kind == lower.State {
					devState += b.Bytes
				}
			}
			assert.Equal(t, devParams+stagedLive(p.PeakAt, isParam), bd.Params, "params at the peak: those in a window there")
			assert.Equal(t, devState+stagedLive(p.PeakAt, isState), bd.Optimizer, "state at the peak: that in a window there")
			t.Logf("%s %s: peak %d → %d bytes (drop %d; %d offloaded, %d host copies; params at the peak %d → %d)",
				tt.precision, tt.offload, ref.PeakBytes, p.PeakBytes, ref.PeakBytes-p.PeakBytes, offloaded, hostTemps, ref.Peak.Params, bd.Params)
		})
	}
}

// hostTempsLive is the bytes of reference temporaries live at reference
// instruction j that the offloaded program keeps on the host (a param's
// low-precision copy): the reference counts them, the offloaded program
// counts their staged windows instead.
func hostTempsLive(ref, p *lower.Program, j int) int64 {
	host := map[*ir.Value]bool{}
	for _, b := range p.Buffers {
		if b.Host && !b.Kind.Persistent() {
			host[b.Value] = true
		}
	}
	var n int64
	first, last := map[int]int{}, map[int]int{}
	for i, in := range ref.Instrs {
		for _, b := range append(append([]int(nil), in.Args...), in.Out) {
			if b < 0 || !host[ref.Buffers[b].Value] || ref.Buffers[b].Kind.Persistent() {
				continue
			}
			if _, ok := first[b]; !ok {
				first[b] = i
			}
			last[b] = i
		}
	}
	for b, f := range first {
		if f <= j && j <= last[b] {
			n += ref.Buffers[b].Bytes
		}
	}
	return n
}

// Under mixed precision a weight's 16-bit copy is made in the forward and
// read again in the backward; with params offloaded it goes to the host in
// between, like the fp32 master it was cast from. Only the head's copies,
// whose forward and backward uses meet at the turn of the step, stay.
func TestOffloadParamsKeepsLowPrecisionCopiesOnTheHost(t *testing.T) {
	m := offloadModule(t, "bf16")
	ref := lowerWith(t, m, lower.Options{})
	p := lowerWith(t, m, lower.Options{Offload: "params"})
	readInBwd := map[int]bool{}
	for _, in := range ref.Instrs {
		if in.Value.Meta.Phase == ir.PhaseBwd {
			for _, a := range in.Args {
				readInBwd[a] = true
			}
		}
	}
	// Casts of a param that the backward reads again.
	reread := map[*ir.Value]bool{}
	for _, in := range ref.Instrs {
		if in.Op == "cast" && ref.Buffers[in.Args[0]].Kind == lower.Param && readInBwd[in.Out] {
			reread[in.Value] = true
			assert.Equal(t, ir.BF16, ref.Buffers[in.Out].Type.DType)
		}
	}
	var params, copies int64
	onHost := map[*ir.Value]bool{}
	for _, b := range p.Buffers {
		switch {
		case b.Kind == lower.Param:
			assert.True(t, b.Host, b.Name)
			params += b.Bytes
		case b.Host:
			assert.True(t, reread[b.Value], "%s: only a cast the backward reads again is offloaded", b.Value.Where())
			onHost[b.Value] = true
			copies += b.Bytes
		}
	}
	layerCopies := 0
	for v := range reread {
		if v.Meta.Layer >= 0 {
			layerCopies++
			assert.True(t, onHost[v], "%s: a layer's 16-bit weight waits for the backward on the host", v.Where())
		}
	}
	assert.Equal(t, 6*offloadLayers, layerCopies, "per layer: four matrices and two LayerNorm gains")
	assert.Equal(t, params+copies, p.HostBytes, "the host arena holds the params and their offloaded copies")
	// No staged 16-bit copy of a layer's weight spans its forward and backward.
	for _, s := range stagedBuffers(p) {
		h := p.Buffers[s.home]
		if h.Kind.Persistent() || h.Value.Meta.Layer < 0 {
			continue
		}
		phases := map[ir.Phase]bool{}
		for _, u := range s.uses {
			phases[p.Instrs[u].Value.Meta.Phase] = true
		}
		assert.Len(t, phases, 1, "%s: one window per phase", h.Value.Where())
	}
}

// Device temporaries never share bytes while both are live, and host
// buffers never overlap in the host arena.
func TestOffloadMemoryPlanNeverOverlaps(t *testing.T) {
	for _, off := range []string{"params", "optimizer,params"} {
		for _, prec := range []string{"", "bf16"} {
			p := lowerWith(t, offloadModule(t, prec), lower.Options{Offload: off})
			ranges := liveRanges(p)
			var ids []int
			for b := range ranges {
				if !p.Buffers[b].Host {
					ids = append(ids, b)
				}
			}
			for i, a := range ids {
				for _, b := range ids[i+1:] {
					ra, rb := ranges[a], ranges[b]
					if ra[1] < rb[0] || rb[1] < ra[0] {
						continue
					}
					ba, bb := p.Buffers[a], p.Buffers[b]
					assert.False(t, ba.Offset < bb.Offset+bb.Bytes && bb.Offset < ba.Offset+ba.Bytes, "%s %s: live buffers %d and %d share bytes", off, prec, a, b)
				}
			}
			var host []lower.Buffer
			for _, b := range p.Buffers {
				if b.Host {
					host = append(host, b)
					assert.LessOrEqual(t, b.Offset+b.Bytes, p.HostBytes)
				}
			}
			for i, a := range host {
				for _, b := range host[i+1:] {
					assert.False(t, a.Offset < b.Offset+b.Bytes && b.Offset < a.Offset+a.Bytes, "host buffers %s and %s overlap", a.Name, b.Name)
				}
			}
			assert.LessOrEqual(t, float64(p.ArenaBytes), 1.05*float64(p.PeakBytes), "%s %s: arena within 5%% of the peak", off, prec)
			assert.True(t, strings.Contains(p.Describe(), "host"), p.Describe())
		}
	}
}
