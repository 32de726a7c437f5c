package planner

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"

	"gcompile/compile"
	"gcompile/cost"
	"gcompile/runtime"
)

// Row is one reported plan as the table and --metrics show it.
type Row struct {
	Rank int    `json:"rank"`
	Plan string `json:"plan"`
	PlanFields
	StepMs          float64 `json:"predicted_step_ms"`
	TokensPerSec    float64 `json:"tokens_per_s"`
	TFLOPSPerDevice float64 `json:"tflops_per_device"`
	MFU             float64 `json:"mfu"`
	Bubble          float64 `json:"bubble"`
	PeakBytes       int64   `json:"peak_bytes"`
	PeakExact       bool    `json:"peak_exact"`
	// OverMemory: the estimate is over the device's memory (the plan was
	// not compiled; Candidate.OverMemory).
	OverMemory bool `json:"over_memory,omitempty"`
	// NearMemory: the estimate is within planner.EstimateMargin below
	// the device's memory (not compiled; Candidate.NearMemory).
	NearMemory bool               `json:"near_memory,omitempty"`
	CommMs     map[string]float64 `json:"comm_ms"`
}

// PlanFields are a plan's axes as the JSON of --plan --metrics names
// them: a row's, and a measured plan's for --calibrate (MeasuredPlan).
type PlanFields struct {
	TP               int    `json:"tp"`
	PP               int    `json:"pp"`
	DP               int    `json:"dp"`
	EP               int    `json:"ep"`
	CP               int    `json:"cp"`
	CPImpl           string `json:"cp_impl,omitempty"`
	CPLayout         string `json:"cp_layout,omitempty"`
	VPP              int    `json:"vpp"`
	MicroBatch       int    `json:"microbatch_size"`
	Microbatches     int    `json:"microbatches"`
	Zero             int    `json:"zero"`
	SequenceParallel bool   `json:"sequence_parallel"`
	Recompute        string `json:"recompute"`
	Offload          string `json:"offload"`
	Schedule         string `json:"schedule"`
	// OverlapGradReduce is --overlap-grad-reduce (nil in a measured plan
	// that leaves it out: the command line's).
	OverlapGradReduce *bool `json:"overlap_grad_reduce,omitempty"`
	// GradReduceDType is --grad-reduce-dtype ("" in a measured plan that
	// leaves it out: the command line's).
	GradReduceDType string `json:"grad_reduce_dtype,omitempty"`
}

// cpImpl and cpLayout are the plan's attention over cp and the layout
// of its sequence, or "" without cp.
func cpImpl(c compile.Config) string {
	if c.CP > 1 {
		return c.CPImpl
	}
	return ""
}

func cpLayout(c compile.Config) string {
	if c.CP > 1 {
		return c.CPLayout
	}
	return ""
}

// Rows turns the ranked plans into rows.
func Rows(res *Result, hw *cost.Hardware) []Row {
	var rows []Row
	for i, c := range res.Ranked {
		cfg := c.Config
		step := c.StepSeconds()
		flops, model, bubble := c.Estimate.FLOPs, c.Estimate.ModelFLOPs, c.Estimate.Bubble
		comm := c.Estimate.CommSeconds
		if c.Prediction != nil {
			// The compiled plan's FLOPs are its ops' (the optimizer's and
			// the elementwise ones too); MFU keeps the model's FLOPs of
			// the formula (Narayanan et al.'s eq. 3 without recompute, as
			// PaLM defines it), so every row's is the same numerator.
			flops, bubble, comm = c.Prediction.FLOPs, c.Prediction.Bubble, c.Prediction.CommSeconds
		}
		n := float64(cfg.Devices)
		r := Row{Rank: i + 1, Plan: Describe(cfg), PlanFields: fieldsOf(c),
			StepMs: step * 1e3, TokensPerSec: float64(cfg.Batch*res.Shape.Seq) / step,
			TFLOPSPerDevice: flops / step / n / 1e12, MFU: model / (step * n * hw.Peak(c.Plan.DTypeName())),
			Bubble: bubble, PeakBytes: c.MemoryBytes(), PeakExact: c.Compiled, OverMemory: c.OverMemory, NearMemory: c.NearMemory, CommMs: map[string]float64{}}
		for k, v := range comm {
			r.CommMs[k] = v * 1e3
		}
		rows = append(rows, r)
	}
	return rows
}

// WriteTable prints the rows, then why the first one wins.
func WriteTable(w io.Writer, res *Result, hw *cost.Hardware) error {
	rows := Rows(res, hw)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "#\tplan\tstep ms\ttokens/s\tTFLOP/s/dev\tMFU\tbubble\tmem/dev\tcomm ms (axis)\t")
	for _, r := range rows {
		mem := gib(r.PeakBytes)
		if !r.PeakExact {
			mem = "~" + mem
		}
		if r.OverMemory {
			mem += " (over)"
		}
		if r.NearMemory {
			mem += " (near)"
		}
		fmt.Fprintf(tw, "%d\t%s\t%.3f\t%.0f\t%.3g\t%.1f%%\t%.3f\t%s\t%s\t\n", r.Rank, r.Plan, r.StepMs, r.TokensPerSec,
			r.TFLOPSPerDevice, 100*r.MFU, r.Bubble, mem, commString(r.CommMs))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "%d candidates on %s: %d ranked, %d dropped by the memory bound, %d rejected in all",
		res.Considered, hw.Name, len(res.Ranked), res.Pruned, res.RejectedCount)
	if top := res.topReasons(2); len(top) > 0 {
		// Why, for the most of them (the JSON of --metrics lists each).
		fmt.Fprintf(w, " (most often: %s)", strings.Join(top, "; "))
	}
	if len(rows) > 0 && !rows[0].PeakExact {
		fmt.Fprint(w, " (memory marked ~ is estimated: the plans were not compiled)")
	}
	if slices.ContainsFunc(rows, func(r Row) bool { return r.NearMemory }) {
		fmt.Fprintf(w, "; plans marked (near) are within %.0f %% of the device's %s by the estimate, which can miss a compiled plan's memory by about that much, and rank after those further below it: compiling one settles it", 100*EstimateMargin, gib(res.MemoryBytes))
	}
	if n := len(rows); n > 0 && rows[n-1].OverMemory {
		fmt.Fprintf(w, "; plans marked (over) are over the device's %s by the estimate and rank after those that fit: compiling one settles it", gib(res.MemoryBytes))
	}
	fmt.Fprintln(w)
	if why := Why(res, hw); why != "" {
		fmt.Fprintln(w, why)
	}
	return nil
}

func commString(m map[string]float64) string {
	keys := make([]string, 0, len(m))
	for k, v := range m {
		if v > 0 {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %.3g", k, m[k]))
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, ", ")
}

// Why explains the winner against the runner-up: which part of the step
// (compute, the bubble, communication per axis) makes the difference.
func Why(res *Result, hw *cost.Hardware) string {
	if len(res.Ranked) == 0 {
		return ""
	}
	best := res.Ranked[0]
	if len(res.Ranked) == 1 {
		if len(res.Rejected) == 0 && res.Considered > 1 {
			return fmt.Sprintf("best: %s, the only plan compiled (--plan-top 1: the others were ranked by the estimate alone)", Describe(best.Config))
		}
		return fmt.Sprintf("best: %s, the only plan that fits", Describe(best.Config))
	}
	next := res.Ranked[1]
	parts := func(c *Candidate) map[string]float64 {
		out := map[string]float64{}
		if c.Prediction != nil {
			out["compute"] = c.Prediction.ComputeSeconds
			for k, v := range c.Prediction.CommSeconds {
				out[k+" communication"] = v
			}
			wait := "pipeline bubble and waiting"
			switch {
			case c.Config.PP > 1:
			case hw.HostCores > 0:
				wait = "waiting for the host's shared cores"
			default:
				wait = "waiting"
			}
			out[wait] = c.Prediction.StepSeconds - c.Prediction.Busy[argmax(c.Prediction.Busy)]
			return out
		}
		out["compute"] = c.Estimate.ComputeSeconds
		for k, v := range c.Estimate.CommSeconds {
			out[k+" communication"] = v
		}
		return out
	}
	a, b := parts(best), parts(next)
	type diff struct {
		name string
		d    float64
	}
	var ds []diff
	for k := range merge(a, b) {
		ds = append(ds, diff{k, b[k] - a[k]})
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i].d > ds[j].d })
	gain := (next.StepSeconds() - best.StepSeconds()) / next.StepSeconds()
	if math.Abs(gain) < 1e-3 {
		// A tie: the simpler plan leads (rankPlans).
		return fmt.Sprintf("best: %s, as fast as %s (within 0.1 %%) with less machinery", Describe(best.Config), Describe(next.Config))
	}
	s := fmt.Sprintf("best: %s, %.1f %% faster than %s", Describe(best.Config), 100*gain, Describe(next.Config))
	if len(ds) > 0 && ds[0].d > 0 {
		s += fmt.Sprintf(": %.3g ms less %s", ds[0].d*1e3, ds[0].name)
	}
	return s
}

func merge(a, b map[string]float64) map[string]bool {
	out := map[string]bool{}
	for k := range a {
		out[k] = true
	}
	for k := range b {
		out[k] = true
	}
	return out
}

func argmax(xs []float64) int {
	best := 0
	for i, x := range xs {
		if x > xs[best] {
			best = i
		}
	}
	return best
}

// fieldsOf is a candidate's axes as the JSON names them.
func fieldsOf(c *Candidate) PlanFields {
	cfg := c.Config
	return PlanFields{TP: cfg.TP, PP: cfg.PP, DP: cfg.DP, EP: max(cfg.EP, 1), CP: max(cfg.CP, 1), CPImpl: cpImpl(cfg), CPLayout: cpLayout(cfg), VPP: cfg.VPP,
		MicroBatch: c.Plan.MicroBatch, Microbatches: cfg.Microbatches, Zero: cfg.Zero, SequenceParallel: cfg.SequenceParallel,
		Recompute: cfg.Recompute, Offload: cfg.Offload, Schedule: cfg.Schedule, OverlapGradReduce: new(!cfg.SerialGradReduce),
		GradReduceDType: cmp.Or(cfg.GradReduceDType, "fp32")}
}

// RejectedRow is a plan the search dropped, and why.
type RejectedRow struct {
	Plan string `json:"plan"`
	PlanFields
	Reason string `json:"reason"`
}

// WriteJSON writes the rows (--metrics with --plan). When the search
// found no plan (failure, its error) the file still says what was
// searched: no rows, the error, and the plans dropped with their
// reasons (the first of them the search keeps), for a script that
// reads the file rather than the message.
func WriteJSON(path string, res *Result, hw *cost.Hardware, failure error) error {
	type model struct {
		Params int64 `json:"params,omitempty"`
	}
	precision := res.Precision
	if precision == "" {
		precision = "fp32"
	}
	out := struct {
		Hardware   string `json:"hardware"`
		Source     string `json:"hardware_source"` // where its figures come from (a calibration's measurements)
		Considered int    `json:"candidates"`
		// The model the plans are of: a calibration from these rows
		// (step_ms added) checks that its model is this one.
		Model     model         `json:"model"`
		Precision string        `json:"precision"`
		Set       string        `json:"set,omitempty"`
		Plans     []Row         `json:"plans"`
		Error     string        `json:"error,omitempty"`
		Rejected  []RejectedRow `json:"rejected,omitempty"`
	}{Hardware: hw.Name, Source: hw.Source, Considered: res.Considered, Model: model{res.Params}, Precision: precision, Set: res.Set, Plans: Rows(res, hw)}
	if out.Plans == nil {
		out.Plans = []Row{}
	}
	if failure != nil {
		out.Error = failure.Error()
		for _, c := range res.Rejected {
			out.Rejected = append(out.Rejected, RejectedRow{Plan: Describe(c.Config), PlanFields: fieldsOf(c), Reason: c.Rejected})
		}
	}
	data, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		return err
	}
	return runtime.WriteFileAtomic(path, append(data, '\n'))
}

// topReasons are the n reasons that rejected the most candidates, each
// with its count, the most first (ties by reason).
func (r *Result) topReasons(n int) []string {
	reasons := slices.Collect(maps.Keys(r.rejectedBy))
	slices.SortFunc(reasons, func(a, b string) int {
		if c := cmp.Compare(r.rejectedBy[b], r.rejectedBy[a]); c != 0 {
			return c
		}
		return strings.Compare(a, b)
	})
	var top []string
	for _, why := range reasons[:min(n, len(reasons))] {
		top = append(top, fmt.Sprintf("%d × %s", r.rejectedBy[why], why))
	}
	return top
}
