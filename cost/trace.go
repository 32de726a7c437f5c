package cost

import (
	"encoding/json"
	"fmt"

	"gcompile/ir"
	"gcompile/lower"
	"gcompile/runtime"
)

// Trace processes. The runtime's --trace numbers its kernels 0 and its
// schedule actions 1 (runtime.Tracer); the prediction takes 2 and 3, so
// the traceEvents of a measured and a predicted trace can be concatenated
// into one file, each predicted device below its measured one.
const (
	tracePidKernels = 2
	tracePidActions = 3
)

// maxTraceDevices bounds the devices drawn one by one: a plan on more
// draws only the first device of each pipeline rank (the others of a rank
// run the same timeline), so a 3072-GPU plan does not write a gigabyte.
const maxTraceDevices = 64

// traceEvents is the prediction's timeline as Chrome trace events in the
// runtime's --trace format (chrome://tracing, Perfetto): per device a
// track of one slice per instruction, named by its op, its category the
// value's phase ("comm" for collectives and transfers), with the value,
// the user's source line and the local type in its args, and the
// predicted mesh axis for communication; copies of offloaded buffers on
// a track of their own ("device N copies"); under a pipeline one slice per
// schedule action ("F c1 m3") on a second process. Times are microseconds
// from the step's start; the step is one (args.step 1), where the runtime
// traces its first runtime.TraceSteps.
func traceEvents(progs []*lower.Program, pred *Prediction) ([]runtime.TraceEvent, error) {
	tl := pred.Timeline
	if tl == nil || len(progs) == 0 {
		return nil, fmt.Errorf("trace: the prediction has no timeline")
	}
	devices := len(tl.RankOfDevice)
	drawn := make([]int, 0, min(devices, maxTraceDevices))
	if devices <= maxTraceDevices {
		for d := range devices {
			drawn = append(drawn, d)
		}
	} else {
		seen := map[int]bool{}
		for d, r := range tl.RankOfDevice {
			if !seen[r] {
				seen[r] = true
				drawn = append(drawn, d)
			}
		}
	}
	events := []runtime.TraceEvent{
		{Name: "process_name", Ph: "M", Pid: tracePidKernels, Args: map[string]any{"name": "predicted kernels"}},
		{Name: "process_name", Ph: "M", Pid: tracePidActions, Args: map[string]any{"name": "predicted schedule actions"}},
	}
	hasCopies := make([]bool, len(tl.Instrs))
	for r, ss := range tl.Instrs {
		for _, s := range ss {
			hasCopies[r] = hasCopies[r] || s.Copy
		}
	}
	for _, d := range drawn {
		name := fmt.Sprintf("device %d", d)
		for _, pid := range []int{tracePidKernels, tracePidActions} {
			events = append(events, runtime.TraceEvent{Name: "thread_name", Ph: "M", Pid: pid, Tid: d, Args: map[string]any{"name": name}})
		}
		if hasCopies[tl.RankOfDevice[d]] {
			events = append(events, runtime.TraceEvent{Name: "thread_name", Ph: "M", Pid: tracePidKernels, Tid: devices + d, Args: map[string]any{"name": name + " copies"}})
		}
	}
	for _, d := range drawn {
		r := tl.RankOfDevice[d]
		prog := lower.ProgramOf(progs, d)
		if len(prog.Instrs) != len(tl.Instrs[r]) {
			return nil, fmt.Errorf("trace: device %d runs %d instructions, the timeline has %d", d, len(prog.Instrs), len(tl.Instrs[r]))
		}
		for i, in := range prog.Instrs {
			s := tl.Instrs[r][i]
			cat := in.Op
			args := map[string]any{"step": 1}
			if in.Value != nil {
				cat = in.Value.Meta.Phase.String()
				args["value"], args["pos"], args["type"] = in.Value.Ref(), in.Value.Pos.String(), in.Value.Type.String()
			}
			if in.Op == "send" || in.Op == "recv" || ir.Collectives[in.Op] {
				cat = "comm"
			}
			if s.Axis != "" {
				args["axis"] = s.Axis
			}
			tid := d
			if s.Copy {
				tid = devices + d
			}
			events = append(events, runtime.TraceEvent{Name: in.Op, Cat: cat, Ph: "X", Ts: s.Start * 1e6, Dur: s.Seconds * 1e6, Pid: tracePidKernels, Tid: tid, Args: args})
		}
		if tl.Actions != nil {
			for _, a := range tl.Actions[r] {
				events = append(events, runtime.TraceEvent{Name: a.Name, Cat: "schedule", Ph: "X", Ts: a.Start * 1e6, Dur: a.Seconds * 1e6,
					Pid: tracePidActions, Tid: d, Args: map[string]any{"step": 1}})
			}
		}
	}
	return events, nil
}

// WriteTrace writes traceEvents to path as a JSON object with
// traceEvents, as the runtime's --trace does.
func WriteTrace(path string, progs []*lower.Program, pred *Prediction) error {
	events, err := traceEvents(progs, pred)
	if err != nil {
		return err
	}
	b, err := json.Marshal(map[string]any{"traceEvents": events, "displayTimeUnit": "ms"})
	if err != nil {
		return fmt.Errorf("trace: %w", err)
	}
	if err := runtime.WriteFileAtomic(path, b); err != nil {
		return fmt.Errorf("trace: %w", err)
	}
	return nil
}
