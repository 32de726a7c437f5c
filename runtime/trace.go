package runtime

import (
	"encoding/json"
	"fmt"
	"os"
	"time"

	"gcompile/lower"
)

// TraceSteps is how many steps a trace records: enough to see the steady
// state without writing every kernel of a long run.
const TraceSteps = 3

// Tracer collects Chrome trace events (chrome://tracing, Perfetto): one
// track per device, one slice per instruction named by its op, with the
// user's source line and the phase in its args.
type Tracer struct {
	prog   *lower.Program
	origin time.Time
	events []traceEvent
	step   int
}

type traceEvent struct {
	Name string         `json:"name"`
	Cat  string         `json:"cat"`
	Ph   string         `json:"ph"`
	Ts   float64        `json:"ts"`
	Dur  float64        `json:"dur"`
	Pid  int            `json:"pid"`
	Tid  int            `json:"tid"`
	Args map[string]any `json:"args,omitempty"`
}

// NewTracer starts a trace for one device's program.
func NewTracer(prog *lower.Program) *Tracer {
	return &Tracer{prog: prog, origin: time.Now(), step: 1}
}

// Record is the device's per-instruction hook.
func (t *Tracer) Record(i int, start time.Time, d time.Duration) {
	in := t.prog.Instrs[i]
	t.events = append(t.events, traceEvent{
		Name: in.Op, Cat: in.Value.Meta.Phase.String(), Ph: "X",
		Ts: float64(start.Sub(t.origin).Nanoseconds()) / 1e3, Dur: float64(d.Nanoseconds()) / 1e3,
		Args: map[string]any{"value": in.Value.Ref(), "pos": in.Value.Pos.String(), "step": t.step, "type": in.Value.Type.String()},
	})
}

// EndStep marks a step boundary.
func (t *Tracer) EndStep() { t.step++ }

// WriteFile writes the trace as a JSON object with traceEvents.
func (t *Tracer) WriteFile(path string) error {
	meta := traceEvent{Name: "thread_name", Ph: "M", Args: map[string]any{"name": "device 0"}}
	b, err := json.Marshal(map[string]any{"traceEvents": append([]traceEvent{meta}, t.events...), "displayTimeUnit": "ms"})
	if err != nil {
		return fmt.Errorf("trace: %w", err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return fmt.Errorf("trace: %w", err)
	}
	return nil
}
