package runtime

import (
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"gcompile/ir"
	"gcompile/lower"
)

// TraceSteps is how many steps a trace records: enough to see the steady
// state without writing every kernel of a long run.
const TraceSteps = 3

// Tracer collects Chrome trace events (chrome://tracing, Perfetto): one
// track per device, one slice per instruction named by its op, with the
// user's source line and the phase in its args; under pipeline parallelism
// the instructions of one schedule action are also one slice ("F c1 m3").
type Tracer struct {
	progs  []*lower.Program // per device
	origin time.Time
	mu     sync.Mutex
	events []TraceEvent
	step   int
	open   []*TraceEvent // per device: the action slice being extended
}

// TraceEvent is one Chrome trace event (chrome://tracing, Perfetto) as
// --trace writes them; the cost model's predicted traces use it too, so
// a measured and a predicted file can be merged.
type TraceEvent struct {
	Name string         `json:"name"`
	Cat  string         `json:"cat"`
	Ph   string         `json:"ph"`
	Ts   float64        `json:"ts"`
	Dur  float64        `json:"dur"`
	Pid  int            `json:"pid"`
	Tid  int            `json:"tid"`
	Args map[string]any `json:"args,omitempty"`
}

// NewTracer starts a trace of devices running progs (progs[i] on device i).
func NewTracer(progs []*lower.Program) *Tracer {
	return &Tracer{progs: progs, origin: time.Now(), step: 1, open: make([]*TraceEvent, len(progs))}
}

// Hook returns device dev's per-instruction hook.
func (t *Tracer) Hook(dev int) func(i int, start time.Time, d time.Duration) {
	return func(i int, start time.Time, d time.Duration) { t.record(dev, i, start, d) }
}

func (t *Tracer) record(dev, i int, start time.Time, d time.Duration) {
	in := t.progs[dev].Instrs[i]
	ts, dur := float64(start.Sub(t.origin).Nanoseconds())/1e3, float64(d.Nanoseconds())/1e3
	name, cat := in.Op, in.Op
	if in.Value != nil {
		cat = in.Value.Meta.Phase.String()
	}
	args := map[string]any{"step": t.step}
	if in.Value != nil {
		args["value"], args["pos"], args["type"] = in.Value.Ref(), in.Value.Pos.String(), in.Value.Type.String()
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if in.Op == "send" || in.Op == "recv" || ir.Collectives[in.Op] {
		cat = "comm"
	}
	t.events = append(t.events, TraceEvent{Name: name, Cat: cat, Ph: "X", Ts: ts, Dur: dur, Pid: 0, Tid: dev, Args: args})
	if in.Block == "" {
		return
	}
	// One slice per schedule action, on its own track below the device's.
	if o := t.open[dev]; o != nil && o.Name == in.Block && o.Args["step"] == t.step {
		o.Dur = ts + dur - o.Ts
		return
	}
	t.flush(dev)
	t.open[dev] = &TraceEvent{Name: in.Block, Cat: "schedule", Ph: "X", Ts: ts, Dur: dur, Pid: 1, Tid: dev, Args: map[string]any{"step": t.step}}
}

func (t *Tracer) flush(dev int) {
	if o := t.open[dev]; o != nil {
		t.events = append(t.events, *o)
		t.open[dev] = nil
	}
}

// EndStep marks a step boundary.
func (t *Tracer) EndStep() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for dev := range t.open {
		t.flush(dev)
	}
	t.step++
}

// WriteFile writes the trace as a JSON object with traceEvents.
func (t *Tracer) WriteFile(path string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	for dev := range t.open {
		t.flush(dev)
	}
	var meta []TraceEvent
	meta = append(meta, TraceEvent{Name: "process_name", Ph: "M", Pid: 0, Args: map[string]any{"name": "kernels"}},
		TraceEvent{Name: "process_name", Ph: "M", Pid: 1, Args: map[string]any{"name": "schedule actions"}})
	for dev := range t.progs {
		for pid := range 2 {
			meta = append(meta, TraceEvent{Name: "thread_name", Ph: "M", Pid: pid, Tid: dev, Args: map[string]any{"name": fmt.Sprintf("device %d", dev)}})
		}
	}
	b, err := json.Marshal(map[string]any{"traceEvents": append(meta, t.events...), "displayTimeUnit": "ms"})
	if err != nil {
		return fmt.Errorf("trace: %w", err)
	}
	if err := WriteFileAtomic(path, b); err != nil {
		return fmt.Errorf("trace: %w", err)
	}
	return nil
}
