package cost

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"os"
	"slices"
	"sort"
	"strings"

	"gcompile/internal/jsonerr"
	"gcompile/ir"
	"gcompile/lower"
	"gcompile/runtime"
)

// ErrTraceMismatch is a trace that was not recorded from the programs it
// is matched to: refining from it would fit the preset to another plan.
var ErrTraceMismatch = errors.New("trace does not match the plan")

// minSamples is the fewest instructions of a class that refine its
// parameters: with fewer, one noisy kernel would set them.
const minSamples = 3

// RefinedParam is one parameter of a refinement: its JSON key, its value
// before and after, and how many measured instructions decided it. A kept
// parameter has After == Before and says why in Why.
type RefinedParam struct {
	Key           string
	Before, After float64
	Samples       int
	Kept          bool
	Why           string
}

// RefineReport says what Refine fitted and how well the model then
// predicts the measured instructions.
type RefineReport struct {
	Params []RefinedParam
	// Instructions is the number of (device, instruction) pairs matched,
	// Steps the trace steps their medians were taken over.
	Instructions int
	Steps        []int
	// LogErrorBefore and LogErrorAfter are the median |ln(predicted /
	// measured)| over the priced instructions, under the preset and the
	// refined one.
	LogErrorBefore, LogErrorAfter float64
	// Fitted is how many parameters the refinement changed.
	Fitted int
}

// ReadTrace reads the events of a Chrome trace file as --trace and
// --plan-trace write it (an object with traceEvents, or a bare array).
func ReadTrace(path string) ([]runtime.TraceEvent, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("trace: %w", err)
	}
	var obj struct {
		TraceEvents []runtime.TraceEvent `json:"traceEvents"`
	}
	if err := json.Unmarshal(raw, &obj); err != nil {
		var arr []runtime.TraceEvent
		if err2 := json.Unmarshal(raw, &arr); err2 != nil {
			// jsonerr says where (line and column) and what: a file
			// cut short, empty, or another kind of JSON.
			return nil, fmt.Errorf("trace %s: %w (want the Chrome trace --trace writes: an object with traceEvents, or a list of events)", path, jsonerr.Decode(raw, err))
		}
		obj.TraceEvents = arr
	}
	const want = "want the Chrome trace --trace writes of a --run"
	if len(obj.TraceEvents) == 0 {
		// Another JSON file (a --metrics, a hardware description) reads
		// as an object without traceEvents.
		return nil, fmt.Errorf("trace %s: no trace events in it: not a trace (%s)", path, want)
	}
	return obj.TraceEvents, nil
}

// PredictedTrace names the predicted process of a trace WriteTrace wrote
// (--plan-trace's "predicted kernels"), or "" for a measured one: refined
// against, a prediction would fit the description to itself.
func PredictedTrace(events []runtime.TraceEvent) string {
	for _, e := range events {
		if name, _ := e.Args["name"].(string); e.Ph == "M" && e.Name == "process_name" && strings.HasPrefix(name, "predicted ") {
			return name
		}
	}
	return ""
}

// Save writes h as a JSON hardware file that Load reads back.
func (h *Hardware) Save(path string) error {
	if err := h.Validate(); err != nil {
		return err
	}
	b, err := json.MarshalIndent(h, "", "  ")
	if err != nil {
		return fmt.Errorf("hardware: %w", err)
	}
	if err := runtime.WriteFileAtomic(path, append(b, '\n')); err != nil {
		return fmt.Errorf("hardware: %w", err)
	}
	return nil
}

// maxEventUS is the longest a traced kernel may last: an hour.
const maxEventUS = 3.6e9

// measured is one instruction's median time in the trace.
type measured struct {
	dev, idx int
	seconds  float64
}

// matchTrace pairs the kernel events of a trace with the instructions of
// progs that produced them and returns each instruction's median time
// over the steady-state steps (all but the first, when there are more:
// the first warms caches and allocators). An event is its device's
// instruction by value ref and op, the k-th such event of a step the
// k-th such instruction, so instructions sharing a value (the copies of
// an update) still pair up one to one. A measured trace (process 0) is
// preferred over a predicted one (process 2) in a merged file.
//
// With shared set (virtual devices sharing the host's cores, as
// Hardware.HostCores says), a kernel's event lasts longer while other
// devices' kernels run at once: each of k running together gets 1/k of
// the cores. Its time is then its duration over k, the mean number of
// kernels running during it (its own included), which is what the
// model's "step ≥ summed work over the cores" adds up. Collectives and
// transfers, which mostly wait for their peers, neither count nor are
// divided.
func matchTrace(progs []*lower.Program, events []runtime.TraceEvent, shared bool) ([]measured, []int, error) {
	if len(progs) == 0 {
		return nil, nil, fmt.Errorf("%w: no programs", ErrTraceMismatch)
	}
	devices := 1
	if progs[0].Mesh != nil {
		devices = progs[0].Mesh.Devices()
	}
	pid := -1
	for _, e := range events {
		if e.Ph == "X" && (e.Pid == 0 || e.Pid == tracePidKernels) && (pid < 0 || e.Pid < pid) {
			pid = e.Pid
		}
	}
	if pid < 0 {
		return nil, nil, fmt.Errorf("%w: the trace has no kernel events (process 0 of --trace or %d of --plan-trace)", ErrTraceMismatch, tracePidKernels)
	}
	devOf := func(tid int) int {
		if pid == tracePidKernels && tid >= devices {
			return tid - devices // the predicted copies' track
		}
		return tid
	}
	seen := map[int]bool{}
	type ev struct {
		dev, step int
		ts, dur   float64
		ref, op   string
		share     float64 // 1/k of shared: the part of its duration that is its own
	}
	var evs []ev
	// A device's program by value: each ref's type (as trace events print
	// it) and the instructions of each (ref, op).
	type index struct {
		refs  map[string]string
		byKey map[string][]int
	}
	indexes := map[int]*index{}
	indexOf := func(d int) *index {
		if x, ok := indexes[d]; ok {
			return x
		}
		x := &index{refs: map[string]string{}, byKey: map[string][]int{}}
		for i, in := range lower.ProgramOf(progs, d).Instrs {
			ref := ""
			if in.Value != nil {
				ref = in.Value.Ref()
				x.refs[ref] = in.Value.Type.String()
			}
			k := ref + "\x00" + in.Op
			x.byKey[k] = append(x.byKey[k], i)
		}
		indexes[d] = x
		return x
	}
	for _, e := range events {
		if e.Pid != pid {
			continue
		}
		if e.Ph == "M" && e.Name == "thread_name" {
			if name, _ := e.Args["name"].(string); strings.HasPrefix(name, "device ") && !strings.HasSuffix(name, " copies") {
				seen[e.Tid] = true
			}
			continue
		}
		if e.Ph != "X" {
			continue
		}
		d := devOf(e.Tid)
		if d < 0 || d >= devices {
			return nil, nil, fmt.Errorf("%w: an event on device %d, the plan has %d devices", ErrTraceMismatch, e.Tid, devices)
		}
		seen[d] = true
		step := 1
		switch s := e.Args["step"].(type) {
		case float64:
			step = int(s)
		case int:
			step = s
		}
		ref, _ := e.Args["value"].(string)
		if !(e.Dur >= 0) || e.Dur > maxEventUS || math.IsInf(e.Ts, 0) || math.IsNaN(e.Ts) {
			return nil, nil, fmt.Errorf("%w: event %s %s on device %d lasts %g µs from %g µs: a kernel's time is from 0 to an hour", ErrTraceMismatch, e.Name, ref, d, e.Dur, e.Ts)
		}
		if typ, _ := e.Args["type"].(string); typ != "" && ref != "" {
			if want, ok := indexOf(d).refs[ref]; ok && want != typ {
				return nil, nil, fmt.Errorf("%w: device %d's %s %s computed %s in the trace, %s in the plan: the trace is of another model size or batch, or of another plan or precision (give every axis, --microbatches, --recompute, --sequence-parallel and --precision as the traced run had them)", ErrTraceMismatch, d, e.Name, ref, typ, want)
			}
		}
		evs = append(evs, ev{dev: d, step: step, ts: e.Ts, dur: e.Dur, ref: ref, op: e.Name, share: 1})
	}
	if busy := slices.ContainsFunc(evs, func(e ev) bool { return e.dur > 0 }); !busy {
		return nil, nil, fmt.Errorf("%w: every kernel event of the trace lasts 0 µs: nothing to fit", ErrTraceMismatch)
	}
	if shared {
		// Collectives and transfers mostly wait for their peers, which
		// takes no cores: they neither contend nor are scaled.
		waits := func(op string) bool { return ir.Collectives[op] || op == "send" || op == "recv" }
		var byTs []int // the kernel events, by start
		var maxEventSpan float64
		for i, e := range evs {
			if !waits(e.op) {
				byTs = append(byTs, i)
				maxEventSpan = max(maxEventSpan, e.dur)
			}
		}
		sort.Slice(byTs, func(a, b int) bool { return evs[byTs[a]].ts < evs[byTs[b]].ts })
		for n, i := range byTs {
			e := &evs[i]
			if !(e.dur > 0) {
				continue
			}
			end := e.ts + e.dur
			busy := e.dur // kernel time of all devices within e's span
			for _, j := range byTs[n+1:] {
				o := evs[j]
				if o.ts >= end {
					break
				}
				if o.dev != e.dev {
					busy += min(end, o.ts+o.dur) - o.ts
				}
			}
			for _, j := range slices.Backward(byTs[:n]) {
				o := evs[j]
				if o.ts+o.dur > e.ts && o.dev != e.dev {
					busy += min(end, o.ts+o.dur) - e.ts
				}
				if e.ts-o.ts > maxEventSpan {
					break
				}
			}
			e.share = e.dur / busy
		}
	}
	if devices <= maxTraceDevices && len(seen) != devices {
		return nil, nil, fmt.Errorf("%w: the trace has %d devices, the plan %d", ErrTraceMismatch, len(seen), devices)
	}
	var steps []int
	for _, e := range evs {
		if !slices.Contains(steps, e.step) {
			steps = append(steps, e.step)
		}
	}
	sort.Ints(steps)
	if len(steps) > 1 {
		steps = steps[1:]
	}
	sort.SliceStable(evs, func(i, j int) bool {
		a, b := evs[i], evs[j]
		if a.dev != b.dev {
			return a.dev < b.dev
		}
		if a.step != b.step {
			return a.step < b.step
		}
		return a.ts < b.ts
	})
	// A step that ran more of an instruction than one step has is left
	// out, on every device: a run's last step carries its evaluation's
	// forward in the same trace window (a short run's trace has no other
	// steps), and its collectives would not pair up with one step's.
	over := map[int]string{}
	{
		counts := map[string]int{}
		cd, cs := -1, -1
		for _, e := range evs {
			if e.dev != cd || e.step != cs {
				cd, cs = e.dev, e.step
				clear(counts)
			}
			k := e.ref + "\x00" + e.op
			counts[k]++
			if have := len(indexOf(e.dev).byKey[k]); counts[k] > have && have > 0 && over[e.step] == "" {
				over[e.step] = fmt.Sprintf("device %d, step %d: %s %s occurs %d times, the program has it %d times", e.dev, e.step, e.op, e.ref, counts[k], have)
			}
		}
	}
	if len(over) > 0 {
		kept := evs[:0]
		for _, e := range evs {
			if over[e.step] == "" {
				kept = append(kept, e)
			}
		}
		if len(kept) == 0 {
			var why []string
			for _, w := range over {
				why = append(why, w)
			}
			sort.Strings(why)
			return nil, nil, fmt.Errorf("%w: no traced step is one step of the plan (%s): a run's last step holds its evaluation too, so trace a run longer than the steps --trace records (%d)", ErrTraceMismatch, strings.Join(why, "; "), runtime.TraceSteps)
		}
		evs = kept
		steps = slices.DeleteFunc(steps, func(st int) bool { return over[st] != "" })
		if len(steps) == 0 {
			// Only the warm-up step is left: price it.
			for _, e := range evs {
				if !slices.Contains(steps, e.step) {
					steps = append(steps, e.step)
				}
			}
		}
	}
	times := map[[2]int][]float64{}
	occ := map[string]int{}
	curDev, curStep := -1, -1
	// A collective's event on a device lasts from that device's arrival
	// to the end, so it includes waiting for the slowest member of the
	// group. Its cost is the time from the last arrival to the end: the
	// events of one collective (same step, value, op and occurrence, the
	// same coordinates off its axis) are gathered and cut there.
	type arrival struct {
		key            [2]int
		ts, end, share float64
	}
	groups := map[string][]arrival{}
	// A receive's event likewise starts when the receiver is ready and
	// includes waiting for the sender; the transfer is what follows the
	// later of that start and the end of the matching send (buffered: the
	// data is there once the send returns). A send and its receive share
	// the step, the value, the occurrence and the (sender, receiver) pair.
	type transfer struct {
		haveSend bool
		sendEnd  float64
		recv     arrival
		haveRecv bool
	}
	transfers := map[string]*transfer{}
	mesh := progs[0].Mesh
	pa := -1
	if mesh != nil {
		pa = mesh.PipelineAxis()
	}
	for _, e := range evs {
		if e.dev != curDev || e.step != curStep {
			curDev, curStep = e.dev, e.step
			clear(occ)
		}
		x := indexOf(e.dev)
		if _, ok := x.refs[e.ref]; e.ref != "" && !ok {
			return nil, nil, fmt.Errorf("%w: device %d: the trace names value %s, which the plan's program does not have", ErrTraceMismatch, e.dev, e.ref)
		}
		k := e.ref + "\x00" + e.op
		n := occ[k]
		occ[k]++
		if n >= len(x.byKey[k]) {
			return nil, nil, fmt.Errorf("%w: device %d, step %d: %s %s occurs %d times, the program has it %d times", ErrTraceMismatch, e.dev, e.step, e.op, e.ref, n+1, len(x.byKey[k]))
		}
		if !slices.Contains(steps, e.step) {
			continue
		}
		key := [2]int{e.dev, x.byKey[k][n]}
		in := lower.ProgramOf(progs, e.dev).Instrs[key[1]]
		if ir.Collectives[in.Op] && mesh != nil {
			if ax := mesh.Axis(in.Attrs.Str("axis")); ax >= 0 {
				coords := slices.Clone(mesh.Coords(e.dev))
				coords[ax] = -1
				g := fmt.Sprint(e.step, k, n, coords)
				groups[g] = append(groups[g], arrival{key: key, ts: e.ts, end: e.ts + e.dur, share: e.share})
				continue
			}
		}
		if (in.Op == "send" || in.Op == "recv") && pa >= 0 {
			c := slices.Clone(mesh.Coords(e.dev))
			c[pa] = in.Peer
			from, to := e.dev, mesh.Rank(c)
			if in.Op == "recv" {
				from, to = to, from
			}
			g := fmt.Sprint(e.step, e.ref, n, from, to)
			tr := transfers[g]
			if tr == nil {
				tr = &transfer{}
				transfers[g] = tr
			}
			if in.Op == "send" {
				tr.haveSend, tr.sendEnd = true, e.ts+e.dur
				times[key] = append(times[key], e.dur*e.share*1e-6)
			} else {
				tr.haveRecv, tr.recv = true, arrival{key: key, ts: e.ts, end: e.ts + e.dur, share: e.share}
			}
			continue
		}
		times[key] = append(times[key], e.dur*e.share*1e-6)
	}
	for _, tr := range transfers {
		if !tr.haveRecv {
			continue
		}
		start := tr.recv.ts
		if tr.haveSend {
			start = max(start, tr.sendEnd)
		}
		times[tr.recv.key] = append(times[tr.recv.key], max(tr.recv.end-start, 0)*tr.recv.share*1e-6)
	}
	for _, members := range groups {
		last := members[0].ts
		for _, a := range members {
			last = max(last, a.ts)
		}
		for _, a := range members {
			times[a.key] = append(times[a.key], max(a.end-last, 0)*a.share*1e-6)
		}
	}
	if len(times) == 0 {
		return nil, nil, fmt.Errorf("%w: no instruction events", ErrTraceMismatch)
	}
	out := make([]measured, 0, len(times))
	for k, ts := range times {
		out = append(out, measured{dev: k[0], idx: k[1], seconds: median(ts)})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].dev != out[j].dev {
			return out[i].dev < out[j].dev
		}
		return out[i].idx < out[j].idx
	})
	return out, steps, nil
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	sort.Float64s(s)
	n := len(s)
	if n == 0 {
		return math.NaN()
	}
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// Instruction classes of the fit: which parameters an instruction's time
// depends on under the roofline, as OpTime and instrCosts price it.
const (
	clsNone  = iota // not fitted: copies, sends, unpriced ops, hidden collectives
	clsGEMM         // t = launch + (x + gemm_half_us)/E, x = flops/peak
	clsMem          // t = launch + (x + mem_half_us)/E_mem, x = bytes/bandwidth
	clsVec          // t = launch + x/E_mem, x = flops/vector peak
	clsIntra        // t = launch + a·α + b·β on the intra-node link
	clsInter        // the same on the inter-node link
)

type feature struct {
	cls  int
	x    float64
	a, b float64
}

// features classifies every instruction of prog as device rank runs it
// under h. The split between compute- and memory-bound, and between ring
// and tree all-reduce, follows h, so Refine reclassifies after each fit.
func (h *Hardware) features(prog *lower.Program, rank int) []feature {
	out := make([]feature, len(prog.Instrs))
	mesh := prog.Mesh
	var coords []int
	if mesh != nil {
		coords = mesh.Coords(rank)
	}
	group := func(axis string) []int {
		if mesh == nil || mesh.Axis(axis) < 0 {
			return nil
		}
		return mesh.AxisRanks(coords, mesh.Axis(axis))
	}
	calls := bucketCalls(prog)
	// link classifies a transfer over ranks; a node-crossing one capped at
	// the NVLink rate does not depend on inter_node_gbps and is left out.
	link := func(ranks []int, a, b float64) feature {
		l := h.LinkFor(ranks)
		if !l.InterNode {
			return feature{cls: clsIntra, a: a, b: b}
		}
		k := l.GBps / h.InterGBps
		if l.GBps >= h.IntraGBps {
			return feature{}
		}
		return feature{cls: clsInter, a: a, b: b / k}
	}
	for i, in := range prog.Instrs {
		switch {
		case ir.Collectives[in.Op]:
			ranks := group(in.Attrs.Str("axis"))
			if ranks == nil && in.Value != nil {
				ranks = group(in.Value.Attrs.Str("axis"))
			}
			n := float64(len(ranks))
			s := float64(wholeBytes(in))
			if call, ok := calls[i]; ok {
				if call == 0 {
					continue
				}
				s = call
			}
			if n <= 1 || s <= 0 {
				continue
			}
			a, b := n-1, (n-1)/n*s
			if in.Op == "all_reduce" {
				a, b = 2*a, 2*b
				l := h.LinkFor(ranks)
				ta, tb := 2*math.Ceil(math.Log2(n)), 2*s
				if ta*l.LatencyUS*1e-6+tb/(l.GBps*1e9) < a*l.LatencyUS*1e-6+b/(l.GBps*1e9) {
					a, b = ta, tb
				}
			}
			out[i] = link(ranks, a, b)
		case in.Op == "recv" && mesh != nil && mesh.PipelineAxis() >= 0:
			c := slices.Clone(coords)
			c[mesh.PipelineAxis()] = in.Peer
			out[i] = link([]int{rank, mesh.Rank(c)}, 1, float64(in.OutType.Bytes()))
		case in.Op == "send" || in.Op == "recv" || in.Op == "copy" && isHostCopy(prog, in):
		default:
			f, by, dt, ok := kernelCost(in)
			if !ok {
				continue
			}
			if (in.Op == "cross_entropy" || in.Op == "cross_entropy_grad") && in.Value != nil && mesh != nil && vocabAxis(in.Value.Args[0]) >= 0 {
				continue // collectives hidden inside: not a kernel's time
			}
			mem := h.memTime(float64(by))
			xm := float64(by) / (h.MemoryGBps * 1e9)
			if onMatrixUnits(in.Op) && f > 0 {
				peak := h.Peak(dt.String())
				xg := float64(f) / peak
				if (xg+h.GEMMHalfUS*1e-6)/h.GEMMEfficiency >= mem {
					out[i] = feature{cls: clsGEMM, x: xg}
				} else {
					out[i] = feature{cls: clsMem, x: xm}
				}
				continue
			}
			xv := float64(f) / (h.VectorTFLOPS * 1e12)
			if by <= 0 || xv/h.MemEfficiency > mem {
				out[i] = feature{cls: clsVec, x: xv}
			} else {
				out[i] = feature{cls: clsMem, x: xm}
			}
		}
	}
	return out
}

// Refine fits h's achieved-efficiency figures to a measured trace of the
// compiled plan progs (--trace of a run of it) and returns the refined
// copy; h is not changed. Each instruction's median time over the
// steady-state steps is a sample, and each class of instruction fits the
// parameters its roofline depends on, by least squares in relative error
// (fitLine, as Calibrate):
//
//   - GEMMs (matmul, the attention ops) that are compute-bound: t is a
//     line in flops/peak, slope 1/gemm_efficiency, intercept launch +
//     gemm_half_us/E;
//   - memory-bound kernels: a line in bytes/bandwidth, slope
//     1/mem_efficiency, intercept launch + mem_half_us/E_mem;
//   - launch_us from the smallest instructions: the vector-bound kernels,
//     whose roofline has no fixed cost but the launch. Without them (on
//     GPUs every elementwise kernel is memory-bound) the launch and the
//     memory fixed cost cannot be told apart: launch_us takes the
//     smallest memory-bound kernels' fixed cost beyond mem_half_us, which
//     is kept;
//   - collectives and pipeline receives: α and β of the link they cross
//     (intra-node when the whole group is in one node).
//
// A class with fewer than minSamples instructions keeps its parameters.
// Which class an instruction falls in (compute- or memory-bound, ring or
// tree) depends on the figures, so the fit is repeated until it settles.
// An efficiency fitted above 1 means the peak is higher than the preset
// says: the efficiency becomes 1 and the peak rises instead, so that the
// result stays a valid description.
func (h *Hardware) Refine(progs []*lower.Program, events []runtime.TraceEvent) (*Hardware, *RefineReport, error) {
	if len(events) == 0 {
		return nil, nil, fmt.Errorf("%w: the trace has no events", ErrTraceMismatch)
	}
	ms, steps, err := matchTrace(progs, events, h.HostCores > 0)
	if err != nil {
		return nil, nil, err
	}
	progOf := map[int]*lower.Program{}
	for _, m := range ms {
		if progOf[m.dev] == nil {
			progOf[m.dev] = lower.ProgramOf(progs, m.dev)
		}
	}
	// The fit's classes (compute- or memory-bound, vector- or memory-bound)
	// follow the figures it starts from, and a start far from the trace
	// (rates measured while the machine was busy) settles where its own
	// misclassification put it. The trace alone gives a second start, its
	// kernels' best achieved rates; the fit from each start is kept by how
	// well it predicts the trace, so a noisy preset cannot make the
	// refinement worse than the trace's own figures.
	ceiling := launchCeiling(progOf, ms)
	cur, counts, opSamples := h.fitFrom(progOf, ms, ceiling)
	alt, altCounts, altSamples := traceStart(h, progOf, ms, ceiling).fitFrom(progOf, ms, ceiling)
	_, fromPreset := cur.logErrors(progOf, ms)
	if _, fromTrace := alt.logErrors(progOf, ms); fromTrace < fromPreset-1e-12 {
		cur, counts, opSamples = alt, altCounts, altSamples
	}
	bounded := cur.boundRefined(figuresOf(h, progOf, ms, ceiling), opSamples)
	cur.keep(h)
	after, _ := cur.logErrors(progOf, ms)
	rep := &RefineReport{Instructions: len(ms), Steps: steps}
	param := func(key string, before, after float64, n int, why string) {
		if h.given[key] {
			why = fmt.Sprintf("set on the command line (%s=%g): kept", key, before)
		}
		p := RefinedParam{Key: key, Before: before, After: after, Samples: n, Kept: why != "", Why: why}
		if !p.Kept {
			p.Why = bounded[key]
		}
		rep.Params = append(rep.Params, p)
		if !p.Kept && p.After != p.Before {
			rep.Fitted++
		}
	}
	few := func(n int, what string) string {
		if n >= minSamples {
			return ""
		}
		return fmt.Sprintf("%d %s in the trace, %d needed", n, what, minSamples)
	}
	param("gemm_efficiency", h.GEMMEfficiency, cur.GEMMEfficiency, counts[clsGEMM], few(counts[clsGEMM], "compute-bound GEMMs"))
	param("gemm_half_us", h.GEMMHalfUS, cur.GEMMHalfUS, counts[clsGEMM], few(counts[clsGEMM], "compute-bound GEMMs"))
	if p := cur.Peak("fp32") / h.Peak("fp32"); math.Abs(p-1) > 1e-9 {
		param("peak_tflops.fp32 (all dtypes scaled)", h.PeakTFLOPS["fp32"], cur.PeakTFLOPS["fp32"], counts[clsGEMM], "")
	}
	param("mem_efficiency", h.MemEfficiency, cur.MemEfficiency, counts[clsMem], few(counts[clsMem], "memory-bound kernels"))
	if cur.MemoryGBps != h.MemoryGBps {
		param("memory_gbps", h.MemoryGBps, cur.MemoryGBps, counts[clsMem], "")
		param("vector_tflops", h.VectorTFLOPS, cur.VectorTFLOPS, counts[clsMem], "")
	}
	halfWhy := few(counts[clsMem], "memory-bound kernels")
	if halfWhy == "" && counts[clsVec] < minSamples {
		halfWhy = "no vector-bound kernels to tell the launch from the memory fixed cost"
	}
	param("mem_half_us", h.MemHalfUS, cur.MemHalfUS, counts[clsMem], halfWhy)
	launchWhy := ""
	if counts[clsVec] < minSamples && counts[clsMem] < minSamples {
		launchWhy = fmt.Sprintf("%d small kernels in the trace, %d needed", counts[clsVec]+counts[clsMem], minSamples)
	}
	param("launch_us", h.LaunchUS, cur.LaunchUS, max(counts[clsVec], counts[clsMem]), launchWhy)
	for _, l := range []struct {
		cls            int
		name           string
		gbps, lat      float64
		newGBps, newLt float64
	}{{clsIntra, "intra_node", h.IntraGBps, h.IntraLatencyUS, cur.IntraGBps, cur.IntraLatencyUS},
		{clsInter, "inter_node", h.InterGBps, h.InterLatencyUS, cur.InterGBps, cur.InterLatencyUS}} {
		why := few(counts[l.cls], "collectives on this link")
		param(l.name+"_latency_us", l.lat, l.newLt, counts[l.cls], why)
		param(l.name+"_gbps", l.gbps, l.newGBps, counts[l.cls], why)
	}
	for _, op := range slices.Sorted(maps.Keys(cur.OpScale)) {
		before, ok := h.OpScale[op]
		if !ok {
			before = 1
		}
		param("op_scale."+op, before, cur.OpScale[op], opSamples[op], "")
	}
	for _, op := range slices.Sorted(maps.Keys(opSamples)) {
		if _, kept := cur.OpScale[op]; !kept {
			before, ok := h.OpScale[op]
			if !ok {
				before = 1
			}
			param("op_scale."+op, before, before, opSamples[op], bounded["op_scale."+op])
		}
	}
	if err := cur.Validate(); err != nil {
		return nil, nil, fmt.Errorf("refined hardware: %w", err)
	}
	if !strings.Contains(cur.Source, "refined") {
		cur.Source = strings.TrimSpace(cur.Source + "; refined from a measured trace")
	}
	rep.LogErrorBefore = h.logError(progOf, ms)
	rep.LogErrorAfter = after
	return cur, rep, nil
}

// The bounds of a refinement are the trace's own figures, not the
// description's (a preset may be 100× off a CPU): an achieved GEMM or
// memory rate (peak × efficiency) at least half the best the trace's
// kernels reached and at most refineBound times it (small kernels are
// launch-bound, so the best seen can sit far below what large ones would
// reach, but not without limit), a half-size at most refineBound times
// the longest kernel of its kind in the trace (beyond it no kernel
// measured tells it), an op's scale from at least minOpSamples kernels
// and within opScaleBound of 1. A short trace's few timings (a kernel
// that ran twice, the first run cold) must not turn into a 1000× figure
// that then prices every plan.
const (
	refineBound  = 100
	opScaleBound = 30
	minOpSamples = 3
)

// traceFigures are what a trace says directly: its best achieved GEMM,
// memory and vector rates (traceStart's figures) and its longest GEMM
// and memory-bound kernel.
type traceFigures struct {
	gemmFLOPS, memBps, vecFLOPS float64
	longestGEMM, longestMem     float64 // seconds
}

func figuresOf(h *Hardware, progOf map[int]*lower.Program, ms []measured, ceiling float64) traceFigures {
	st := traceStart(h, progOf, ms, ceiling)
	f := traceFigures{gemmFLOPS: st.Peak("fp32"), memBps: st.MemoryGBps * 1e9, vecFLOPS: st.VectorTFLOPS * 1e12}
	for _, m := range ms {
		in := progOf[m.dev].Instrs[m.idx]
		if ir.Collectives[in.Op] || !(m.seconds > 0) {
			continue
		}
		if _, _, _, ok := kernelCost(in); !ok {
			continue
		}
		if onMatrixUnits(in.Op) {
			f.longestGEMM = math.Max(f.longestGEMM, m.seconds)
		} else {
			f.longestMem = math.Max(f.longestMem, m.seconds)
		}
	}
	return f
}

// boundRefined holds h's fitted figures within the trace's bounds (see
// refineBound), drops the op scales fitted from fewer than minOpSamples
// kernels, and says for each figure it changed why, by its report key.
func (h *Hardware) boundRefined(tr traceFigures, opSamples map[string]int) map[string]string {
	notes := map[string]string{}
	within := func(key string, v, lo, hi float64, unit string) float64 {
		switch {
		case lo > 0 && v < lo:
			notes[key] = fmt.Sprintf("bounded below at %.4g%s by the trace (the fit wanted %.4g)", lo, unit, v)
			return lo
		case hi > 0 && v > hi:
			notes[key] = fmt.Sprintf("bounded above at %.4g%s by the trace (the fit wanted %.4g)", hi, unit, v)
			return hi
		}
		return v
	}
	// Achieved rates: peak × efficiency.
	if tr.gemmFLOPS > 0 {
		got := h.Peak("fp32") * h.GEMMEfficiency
		want := within("peak_tflops.fp32 (all dtypes scaled)", got, tr.gemmFLOPS/2, tr.gemmFLOPS*refineBound, " FLOP/s achieved")
		for d := range h.PeakTFLOPS {
			h.PeakTFLOPS[d] *= want / got
		}
	}
	if tr.memBps > 0 {
		got := h.MemoryGBps * 1e9 * h.MemEfficiency
		h.MemoryGBps *= within("memory_gbps", got, tr.memBps/2, tr.memBps*refineBound, " B/s achieved") / got
	}
	if tr.vecFLOPS > 0 {
		// Elementwise kernels are the most launch-bound: only the floor.
		h.VectorTFLOPS = within("vector_tflops", h.VectorTFLOPS*1e12, tr.vecFLOPS/2, 0, " FLOP/s") / 1e12
	}
	if tr.longestGEMM > 0 {
		h.GEMMHalfUS = within("gemm_half_us", h.GEMMHalfUS, 0, refineBound*tr.longestGEMM*1e6, " µs, 100× its longest GEMM,")
	}
	if tr.longestMem > 0 {
		h.MemHalfUS = within("mem_half_us", h.MemHalfUS, 0, refineBound*tr.longestMem*1e6, " µs, 100× its longest memory-bound kernel,")
	}
	for op, n := range opSamples {
		key := "op_scale." + op
		v, ok := h.OpScale[op]
		switch {
		case !ok:
		case n < minOpSamples:
			notes[key] = fmt.Sprintf("%d kernels of %s in the trace, %d needed (the fit wanted %.4g)", n, op, minOpSamples, v)
			delete(h.OpScale, op)
		case v > opScaleBound:
			notes[key] = fmt.Sprintf("bounded at %g× (the fit wanted %.4g)", float64(opScaleBound), v)
			h.OpScale[op] = opScaleBound
		case v < 1.0/opScaleBound:
			notes[key] = fmt.Sprintf("bounded at 1/%g (the fit wanted %.4g)", float64(opScaleBound), v)
			h.OpScale[op] = 1.0 / opScaleBound
		}
	}
	if len(h.OpScale) == 0 {
		h.OpScale = nil
	}
	return notes
}

// fitFrom is the whole fit started from h: the class fit, then the op
// scales over it, with how many instructions decided each.
func (h *Hardware) fitFrom(progOf map[int]*lower.Program, ms []measured, ceiling float64) (*Hardware, classCounts, map[string]int) {
	cur, counts := h.fitClasses(progOf, ms, ceiling)
	var opSamples map[string]int
	cur.OpScale, opSamples = cur.fitOpScale(progOf, ms)
	return cur, counts, opSamples
}

// classCounts is how many instructions each class of the fit had.
type classCounts [clsInter + 1]int

// fitClasses is the class fit of Refine started from h: each class's
// parameters fitted to its instructions, the instructions reclassified
// under the new figures, until the classes settle (at most 8 rounds). The
// launch cost is never set above ceiling, the trace's launchCeiling:
// every kernel pays it, so it cannot exceed what the fastest kernels took.
func (h *Hardware) fitClasses(progOf map[int]*lower.Program, ms []measured, ceiling float64) (*Hardware, classCounts) {
	cur := h.clone()
	cur.OpScale = nil // the class fit prices plain rooflines; the scales are fitted after it
	var counts classCounts
	var prevCls []int
	for range 8 {
		feats := map[int][]feature{}
		for d, p := range progOf {
			feats[d] = cur.features(p, d)
		}
		cls := make([]int, len(ms))
		var xs, ts [clsInter + 1][]float64
		var as, bs [clsInter + 1][]float64
		for k, m := range ms {
			f := feats[m.dev][m.idx]
			cls[k] = f.cls
			if f.cls == clsNone || !(m.seconds > 0) {
				continue
			}
			xs[f.cls] = append(xs[f.cls], f.x)
			as[f.cls] = append(as[f.cls], f.a)
			bs[f.cls] = append(bs[f.cls], f.b)
			ts[f.cls] = append(ts[f.cls], m.seconds)
		}
		for c := range counts {
			counts[c] = len(ts[c])
		}
		next := cur.clone()
		// Memory first: its slope prices the vector-bound kernels too.
		var memFixed float64
		memFit := false
		if len(ts[clsMem]) >= minSamples {
			var slope *float64
			if h.given["mem_efficiency"] {
				slope = new(1 / cur.MemEfficiency)
			}
			if c, s := fitLine(xs[clsMem], ts[clsMem], nil, slope); s > 0 {
				next.MemEfficiency, memFixed, memFit = 1/s, c, true
			}
		}
		sMem := 1 / next.MemEfficiency
		launch := cur.LaunchUS * 1e-6
		memHalfFit := false
		switch {
		case h.given["launch_us"]:
			memHalfFit = memFit && len(ts[clsVec]) >= minSamples
		case len(ts[clsVec]) >= minSamples:
			sx, st := smallest(xs[clsVec], ts[clsVec])
			launch = median(residuals(sx, st, sMem, 0))
			memHalfFit = memFit
		case memFit:
			sx, st := smallest(xs[clsMem], ts[clsMem])
			launch = median(residuals(sx, st, sMem, cur.MemHalfUS*1e-6*sMem))
		}
		if !h.given["launch_us"] {
			launch = min(math.Max(launch, 0), ceiling)
		}
		next.LaunchUS = launch * 1e6
		if memHalfFit && !h.given["mem_half_us"] {
			next.MemHalfUS = math.Max(memFixed-launch, 0) / sMem * 1e6
		}
		if len(ts[clsGEMM]) >= minSamples {
			// t = launch + (x + half)/E: with E given only the intercept
			// is fitted, with half given only the slope, through the
			// origin of t − launch against x + half.
			var c, s float64
			switch {
			case h.given["gemm_efficiency"] && h.given["gemm_half_us"]:
			case h.given["gemm_half_us"]:
				half := cur.GEMMHalfUS * 1e-6
				sx := make([]float64, len(xs[clsGEMM]))
				for i, x := range xs[clsGEMM] {
					sx[i] = x + half
				}
				_, s = fitLine(sx, ts[clsGEMM], new(launch), nil)
				c = launch + s*half
			case h.given["gemm_efficiency"]:
				c, s = fitLine(xs[clsGEMM], ts[clsGEMM], nil, new(1/cur.GEMMEfficiency))
			default:
				c, s = fitLine(xs[clsGEMM], ts[clsGEMM], nil, nil)
			}
			if s > 0 {
				next.GEMMEfficiency = 1 / s
				next.GEMMHalfUS = math.Max(c-launch, 0) / s * 1e6
			}
		}
		for _, l := range []struct {
			cls       int
			link      string
			gbps, lat *float64
		}{{clsIntra, "intra_node", &next.IntraGBps, &next.IntraLatencyUS}, {clsInter, "inter_node", &next.InterGBps, &next.InterLatencyUS}} {
			if len(ts[l.cls]) < minSamples {
				continue
			}
			ys := make([]float64, len(ts[l.cls]))
			for i, t := range ts[l.cls] {
				ys[i] = t - launch
			}
			var alpha, beta *float64
			if h.given[l.link+"_latency_us"] {
				alpha = new(*l.lat * 1e-6)
			}
			if h.given[l.link+"_gbps"] {
				beta = new(1 / (*l.gbps * 1e9))
			}
			if a, b, ok := fitAlphaBeta(as[l.cls], bs[l.cls], ys, ts[l.cls], alpha, beta); ok {
				*l.lat, *l.gbps = a*1e6, 1/b/1e9
			}
		}
		next.keep(h)
		cur = next
		if slices.Equal(cls, prevCls) {
			break
		}
		prevCls = cls
	}
	cur.normalize()
	return cur, counts
}

// keep sets the figures given on the command line (--hardware
// NAME:key=value) back to from's: a refinement fits the others around
// them.
func (h *Hardware) keep(from *Hardware) {
	if len(h.given) == 0 {
		return
	}
	dst, src := scalarFields(h), scalarFields(from)
	for k := range h.given {
		if d, ok := dst[k]; ok {
			d.Set(src[k])
		}
	}
}

// launchQuantile is the share of a trace's kernels whose time bounds the
// launch cost from above: a low quantile rather than the fastest one, so
// that one timer glitch does not set it.
const launchQuantile = 0.05

// launchCeiling is the launchQuantile quantile of the measured times of
// the trace's priced kernels (+Inf without any).
func launchCeiling(progOf map[int]*lower.Program, ms []measured) float64 {
	var ts []float64
	for _, m := range ms {
		if _, _, _, ok := kernelCost(progOf[m.dev].Instrs[m.idx]); ok && m.seconds > 0 {
			ts = append(ts, m.seconds)
		}
	}
	if len(ts) == 0 {
		return math.Inf(1)
	}
	return quantile(ts, launchQuantile)
}

// bestRateQuantile picks a kernel class's achieved rate in the trace
// start: a high quantile of the per-kernel rates, since the fastest
// kernels are the nearest to the roofline that the efficiencies scale.
const bestRateQuantile = 0.9

// traceStart is h with its rates taken from the trace itself: the peak
// from the matrix kernels' flops per second, the memory bandwidth from
// the other kernels' bytes per second, the vector rate from their flops
// per second (each the bestRateQuantile of its kernels), at efficiency 1,
// no fixed costs, and the launch at ceiling, the trace's launchCeiling.
// Links keep h's figures, which the α–β fit does not start from. A rate
// with no kernel to measure it keeps h's.
func traceStart(h *Hardware, progOf map[int]*lower.Program, ms []measured, ceiling float64) *Hardware {
	var gemm, mem, vec []float64
	for _, m := range ms {
		in := progOf[m.dev].Instrs[m.idx]
		if ir.Collectives[in.Op] || !(m.seconds > 0) {
			continue
		}
		f, by, _, ok := kernelCost(in)
		if !ok {
			continue
		}
		if onMatrixUnits(in.Op) {
			if f > 0 {
				gemm = append(gemm, float64(f)/m.seconds)
			}
			continue
		}
		if by > 0 {
			mem = append(mem, float64(by)/m.seconds)
		}
		if f > 0 {
			vec = append(vec, float64(f)/m.seconds)
		}
	}
	s := h.clone()
	s.OpScale = nil
	if q := quantile(gemm, bestRateQuantile); q > 0 {
		r := q / h.Peak("fp32")
		for k := range s.PeakTFLOPS {
			s.PeakTFLOPS[k] *= r
		}
	}
	if q := quantile(mem, bestRateQuantile); q > 0 {
		s.MemoryGBps = q / 1e9
	}
	if q := quantile(vec, bestRateQuantile); q > 0 {
		s.VectorTFLOPS = q / 1e12
	}
	s.GEMMEfficiency, s.MemEfficiency = 1, 1
	s.GEMMHalfUS, s.MemHalfUS = 0, 0
	if !math.IsInf(ceiling, 0) {
		s.LaunchUS = ceiling * 1e6
	}
	s.keep(h)
	return s
}

// quantile is the q-quantile of xs (nearest rank; 0 when empty).
func quantile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	sort.Float64s(s)
	return s[int(q*float64(len(s)-1))]
}

func (h *Hardware) clone() *Hardware {
	c := *h
	c.PeakTFLOPS = make(map[string]float64, len(h.PeakTFLOPS))
	for k, v := range h.PeakTFLOPS {
		c.PeakTFLOPS[k] = v
	}
	c.OpScale = maps.Clone(h.OpScale)
	return &c
}

// normalize turns an efficiency above 1 into a higher peak at efficiency
// 1, the same times under OpTime: compute f/(P·E) + F½/(P·E) with P·E
// the new peak and the fixed cost F½/E.
func (h *Hardware) normalize() {
	if e := h.GEMMEfficiency; e > 1 {
		for k := range h.PeakTFLOPS {
			h.PeakTFLOPS[k] *= e
		}
		h.GEMMEfficiency, h.GEMMHalfUS = 1, h.GEMMHalfUS/e
	}
	if e := h.MemEfficiency; e > 1 {
		h.MemoryGBps *= e
		h.VectorTFLOPS *= e
		h.MemEfficiency, h.MemHalfUS = 1, h.MemHalfUS/e
	}
}

// smallest keeps the smaller half (at least minSamples) of the samples
// by measured time: the instructions whose fixed cost is most of their
// time.
func smallest(xs, ts []float64) ([]float64, []float64) {
	idx := make([]int, len(ts))
	for i := range idx {
		idx[i] = i
	}
	sort.Slice(idx, func(a, b int) bool { return ts[idx[a]] < ts[idx[b]] })
	n := min(len(idx), max(minSamples, len(idx)/2))
	sx, st := make([]float64, n), make([]float64, n)
	for k, i := range idx[:n] {
		sx[k], st[k] = xs[i], ts[i]
	}
	return sx, st
}

// residuals is t − slope·x − fixed for each sample.
func residuals(xs, ts []float64, slope, fixed float64) []float64 {
	out := make([]float64, len(ts))
	for i := range ts {
		out[i] = ts[i] - slope*xs[i] - fixed
	}
	return out
}

// fitAlphaBeta is the least-squares y = a·α + b·β in relative error to
// the measured t (weights 1/t²), α ≥ 0, with α or β held where one is
// given (a figure set on the command line); ok is false when β comes out
// non-positive (the trace cannot tell the bandwidth).
func fitAlphaBeta(as, bs, ys, ts []float64, heldAlpha, heldBeta *float64) (alpha, beta float64, ok bool) {
	var saa, sab, sbb, say, sby float64
	for i := range ys {
		w := 1 / (ts[i] * ts[i])
		saa, sab, sbb = saa+w*as[i]*as[i], sab+w*as[i]*bs[i], sbb+w*bs[i]*bs[i]
		say, sby = say+w*as[i]*ys[i], sby+w*bs[i]*ys[i]
	}
	switch {
	case heldAlpha != nil && heldBeta != nil:
		return *heldAlpha, *heldBeta, true
	case heldAlpha != nil:
		alpha = *heldAlpha
		if sbb > 0 {
			beta = (sby - alpha*sab) / sbb
		}
	case heldBeta != nil:
		beta = *heldBeta
		if saa > 0 {
			alpha = math.Max((say-beta*sab)/saa, 0)
		}
	default:
		if d := saa*sbb - sab*sab; d > 0 {
			alpha = (sbb*say - sab*sby) / d
			beta = (saa*sby - sab*say) / d
		}
		if !(alpha >= 0) && sbb > 0 {
			alpha, beta = 0, sby/sbb
		}
	}
	return alpha, beta, beta > 0 && !math.IsInf(beta, 0)
}

// logError is the median |ln(predicted/measured)| over the instructions
// Refine fits.
func (h *Hardware) logError(progOf map[int]*lower.Program, ms []measured) float64 {
	med, _ := h.logErrors(progOf, ms)
	return med
}

// logErrors is the median and the mean |ln(predicted/measured)| over the
// instructions Refine fits. The median is the figure reported; the mean,
// which every instruction moves, chooses between fits whose medians tie.
func (h *Hardware) logErrors(progOf map[int]*lower.Program, ms []measured) (med, mean float64) {
	costs := map[int][]instrCost{}
	feats := map[int][]feature{}
	for d, p := range progOf {
		costs[d] = h.instrCosts(p, d)
		feats[d] = h.features(p, d)
	}
	var errs []float64
	for _, m := range ms {
		p := costs[m.dev][m.idx].seconds
		if feats[m.dev][m.idx].cls == clsNone || !(p > 0) || !(m.seconds > 0) {
			continue
		}
		e := math.Abs(math.Log(p / m.seconds))
		errs = append(errs, e)
		mean += e
	}
	if len(errs) > 0 {
		mean /= float64(len(errs))
	}
	return median(errs), mean
}

// opScaleTolerance is how far an op's kernels may sit from the fitted
// roofline before it gets a scale of its own: within it, the class fit
// already prices the op.
const opScaleTolerance = 0.1

// fitOpScale is each kernel op's median measured time over its roofline
// time under h (both beyond the launch), for the ops whose kernels the
// class fit leaves more than opScaleTolerance off, with the number of
// instructions behind each. GEMMs, collectives and transfers have their
// own parameters and get none.
func (h *Hardware) fitOpScale(progOf map[int]*lower.Program, ms []measured) (map[string]float64, map[string]int) {
	feats := map[int][]feature{}
	costs := map[int][]instrCost{}
	for d, p := range progOf {
		feats[d] = h.features(p, d)
		costs[d] = h.instrCosts(p, d)
	}
	ratios := map[string][]float64{}
	launch := h.LaunchUS * 1e-6
	for _, m := range ms {
		f := feats[m.dev][m.idx]
		if f.cls != clsMem && f.cls != clsVec {
			continue
		}
		pred := costs[m.dev][m.idx].seconds - launch
		if !(pred > 0) || !(m.seconds > launch) {
			continue
		}
		op := progOf[m.dev].Instrs[m.idx].Op
		ratios[op] = append(ratios[op], (m.seconds-launch)/pred)
	}
	scale, n := map[string]float64{}, map[string]int{}
	for op, rs := range ratios {
		if k := median(rs); math.Abs(math.Log(k)) > math.Log1p(opScaleTolerance) {
			scale[op], n[op] = k, len(rs)
		}
	}
	if len(scale) == 0 {
		return nil, nil
	}
	return scale, n
}
