package cost

import (
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"testing"
)

// FuzzLoadHardware feeds arbitrary figure sets (a100-80g:SETS) and
// arbitrary hardware files to Load. Properties: Load never panics; what
// it refuses is an ErrBadHardware or ErrUnknownHardware; what it accepts
// validates, and prices a small transformer under two plans (one with
// every axis and a pipeline) at a finite, positive step, so that no
// accepted figure can make the planner rank an infinite or zero time.
func FuzzLoadHardware(f *testing.F) {
	for _, sets := range []string{"inter_node_gbps=12.5,host_op_us=45", "gemm_efficiency=1", "devices_per_node=1",
		"host_op_us=1e6", "launch_us=0,mem_half_us=0,gemm_half_us=0", "memory_gbps=1e-6", "overlap_buckets=false", "a=b=c", ",,"} {
		f.Add(sets, "")
	}
	h100, err := json.Marshal(presets["h100-sxm"])
	if err != nil {
		f.Fatal(err)
	}
	f.Add("", string(h100))
	f.Add("", `{"name": "x", "peak_tflops": {"fp32": 1e-300}}`)
	f.Fuzz(func(t *testing.T, sets, file string) {
		spec := "a100-80g:" + sets
		if file != "" {
			path := filepath.Join(t.TempDir(), "hw.json")
			if err := os.WriteFile(path, []byte(file), 0o644); err != nil {
				t.Fatal(err)
			}
			spec = path
			if sets != "" {
				spec += ":" + sets
			}
		}
		h, err := Load(spec)
		if err != nil {
			if !errors.Is(err, ErrBadHardware) && !errors.Is(err, ErrUnknownHardware) {
				t.Fatalf("Load(%q): %v is neither a bad nor an unknown description", spec, err)
			}
			return
		}
		if err := h.Validate(); err != nil {
			t.Fatalf("Load(%q) accepted what Validate refuses: %v", spec, err)
		}
		shape := Transformer{Layers: 8, Hidden: 512, Heads: 8, Seq: 256, Vocab: 1024, FFN: 2048}
		for _, p := range []Plan{
			{TP: 1, PP: 1, DP: 1, MicroBatch: 1, Microbatches: 1, Precision: "fp32"},
			{TP: 2, PP: 2, DP: 2, VPP: 2, MicroBatch: 2, Microbatches: 4, Zero: 1, SequenceParallel: true,
				Recompute: "selective", Precision: "bf16", Schedule: "interleaved", Offload: "optimizer"},
		} {
			e, err := h.Estimate(shape, p)
			if err != nil {
				t.Fatalf("Load(%q): %v", spec, err)
			}
			if !(e.StepSeconds > 0) || math.IsInf(e.StepSeconds, 0) {
				t.Fatalf("Load(%q) prices %v at %g s", spec, p, e.StepSeconds)
			}
		}
	})
}
