package runtime

import (
	"encoding/json"
	"errors"
	"fmt"

	"gcompile/lower"
)

// Metrics is the --metrics JSON (DESIGN §8). Fields may be added; the
// documented ones stay.
type Metrics struct {
	Config    map[string]any  `json:"config"`
	CompileMs float64         `json:"compile_ms"`
	Passes    []PassMetrics   `json:"passes"`
	Devices   []DeviceMetrics `json:"devices"`
	Schedule  ScheduleMetrics `json:"schedule"`
	Model     ModelMetrics    `json:"model"`
	Data      *DataMetrics    `json:"data,omitempty"`
	Async     *AsyncMetrics   `json:"async,omitempty"`
	Steps     []StepMetrics   `json:"steps"`
	Eval      []EvalMetrics   `json:"eval"`
	// ResumedFrom is the checkpoint the run continued (--resume); Steps
	// then start after its step.
	ResumedFrom *ResumeMetrics `json:"resumed_from,omitempty"`
	// Carried is how many of Steps (and the Eval and Checkpoints up to
	// ResumedFrom's step) come from the run's earlier parts, read from
	// the --metrics file they wrote: the file keeps the whole run, and
	// this part's figures (its speed) are Steps[Carried:].
	Carried int `json:"carried_steps,omitempty"`
	// Checkpoint is the last checkpoint the run wrote, Checkpoints every
	// save; Stopped the signal that ended the run early, if one did.
	Checkpoint  string              `json:"checkpoint,omitempty"`
	Checkpoints []CheckpointMetrics `json:"checkpoints,omitempty"`
	Stopped     string              `json:"stopped,omitempty"`
	// Planner is the table the planner chose the run's plan from
	// (--plan --run), nil otherwise.
	Planner *PlannerMetrics `json:"planner,omitempty"`
	// Failed is the error that ended the run before its last step (a
	// loss that is not finite, a lost process), "" when none did: Steps
	// then hold the steps that completed.
	Failed string `json:"failed,omitempty"`
	// InProgress marks the record a run writes at each checkpoint while
	// it goes on: Steps hold those up to that checkpoint, so a run killed
	// later (a node lost, the out-of-memory killer) leaves its record up
	// to the checkpoint a requeued run resumes. The run's end, or its
	// failure, writes the file again without it.
	InProgress bool `json:"in_progress,omitempty"`
}

// CheckpointMetrics is one checkpoint save: its step and folder, and the
// time the run spent on it (all processes' writes and the commit).
type CheckpointMetrics struct {
	Step int     `json:"step"`
	Dir  string  `json:"dir"`
	Ms   float64 `json:"ms"`
	// ID is the save's checkpoint.Manifest.ID: a folder of the same path
	// and step that another run wrote since has another.
	ID string `json:"id,omitempty"`
}

// ResumeMetrics names the checkpoint a run resumed from.
type ResumeMetrics struct {
	Checkpoint string `json:"checkpoint"`
	Step       int    `json:"step"`
}

// PassMetrics is one pass of the pipeline.
type PassMetrics struct {
	Name    string  `json:"name"`
	Ms      float64 `json:"ms"`
	Changed bool    `json:"changed"`
	Skipped string  `json:"skipped,omitempty"`
	// Note is the pass's note (passes.Result.Note): a request it had
	// nothing to do for, and why.
	Note string `json:"note,omitempty"`
}

// DeviceMetrics is the memory of one device: predicted by the compile-time
// plan and measured by the runtime.
type DeviceMetrics struct {
	Rank               int   `json:"rank"`
	PeakBytesPredicted int64 `json:"peak_bytes_predicted"`
	PeakBytesMeasured  int64 `json:"peak_bytes_measured"`
	ArenaBytes         int64 `json:"arena_bytes"`
	// ParamBytes and OptimizerBytes are the device's share of the model's
	// params and optimizer state wherever they are kept; HostBytes is how
	// many bytes of them (and of other offloaded buffers) live in host
	// memory under --offload instead of the device.
	ParamBytes     int64 `json:"param_bytes"`
	GradBytes      int64 `json:"grad_bytes"`
	OptimizerBytes int64 `json:"optimizer_state_bytes"`
	HostBytes      int64 `json:"host_bytes,omitempty"`
	// PeakBreakdown divides the predicted peak by what the bytes hold.
	PeakBreakdown *lower.Breakdown `json:"peak_breakdown,omitempty"`
	// CollectiveBytes is, per collective and axis ("all_to_all/ep"), the
	// bytes of the device's operands in one step, and under ring attention
	// the bytes it sends around the ring ("ring/cp";
	// lower.Program.CollectiveBytes).
	CollectiveBytes map[string]int64 `json:"collective_bytes_per_step,omitempty"`
	// CollectiveSendBytes is, with the same keys, what the device sends
	// in one step when each collective is a ring over its axis: the
	// traffic on its links (lower.Program.CollectiveSendBytes).
	CollectiveSendBytes map[string]int64 `json:"collective_send_bytes_per_step,omitempty"`
	// Role names what a device runs when it is not one of the plan's
	// devices: "update" for asynchronous data parallelism's parameter
	// server, which holds the master weights and the optimizer state
	// beside the dp replicas ("" for a device of the mesh).
	Role string `json:"role,omitempty"`
}

// ScheduleMetrics describes the pipeline schedule; with one stage there is
// no bubble.
type ScheduleMetrics struct {
	Name            string  `json:"name"`
	BubbleTheory    float64 `json:"bubble_theory"`
	BubbleSimulated float64 `json:"bubble_simulated"`
	// BubbleProfiled is the simulated bubble with the F/B/W durations
	// measured in the run instead of unit costs.
	BubbleProfiled *float64 `json:"bubble_simulated_profiled,omitempty"`
	// StashPeak is, per pipeline rank, the most microbatches whose
	// activations are held at once (forward done, backward not).
	StashPeak []int `json:"activations_stashed_per_rank,omitempty"`
}

// ModelMetrics sizes the model.
type ModelMetrics struct {
	Params int64 `json:"params"`
}

// DataMetrics says what the run trained on.
type DataMetrics struct {
	Source string `json:"source"`
	// Byte-level text: the bytes of each split.
	TrainBytes int `json:"train_bytes,omitempty"`
	EvalBytes  int `json:"eval_bytes,omitempty"`
	// Token datasets: their documents and tokens in all, the --split, the
	// tokenizer file, and the identity a resumed run must match.
	Documents int64  `json:"documents,omitempty"`
	Tokens    int64  `json:"tokens,omitempty"`
	Split     string `json:"split,omitempty"`
	Tokenizer string `json:"tokenizer,omitempty"`
	Identity  string `json:"identity,omitempty"`
}

// WriteFile writes m as indented JSON, replacing path atomically. Lists
// are always lists ([] when a run ended before its first step), and a
// figure that is not finite (a diverged run's loss or gradient norm) is
// written as null rather than losing the file.
func (m *Metrics) WriteFile(path string) error {
	if m.Steps == nil {
		m.Steps = []StepMetrics{}
	}
	if m.Eval == nil {
		m.Eval = []EvalMetrics{}
	}
	if m.Passes == nil {
		m.Passes = []PassMetrics{}
	}
	if m.Devices == nil {
		m.Devices = []DeviceMetrics{}
	}
	b, err := json.MarshalIndent(m, "", "  ")
	var nonFinite *json.UnsupportedValueError
	if errors.As(err, &nonFinite) {
		b, err = finiteJSON(m)
	}
	if err != nil {
		return fmt.Errorf("metrics: %w", err)
	}
	if err := WriteFileAtomic(path, append(b, '\n')); err != nil {
		return fmt.Errorf("metrics: %w", err)
	}
	return nil
}

// AsyncMetrics describes asynchronous data parallelism: the staleness bound
// and the largest staleness a replica actually ran with.
type AsyncMetrics struct {
	Staleness        int `json:"staleness"`
	MaxStalenessSeen int `json:"max_staleness_seen"`
}

// PlannerMetrics is the planner's table in a run's metrics: the hardware
// it priced on, the candidates it considered and the ranked plans (the
// rows --plan --metrics writes alone).
type PlannerMetrics struct {
	Hardware   string `json:"hardware"`
	Candidates int    `json:"candidates"`
	Plans      any    `json:"plans"`
}
