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

// FuzzEstimate prices arbitrary shapes under arbitrary plans on the
// a100-80g preset. Properties: Estimate never panics, and a plan it does
// not refuse gets a finite, positive step time, a finite bubble ≥ 0, and
// a positive memory estimate at least its lower bound (0 with everything
// offloaded).
func FuzzEstimate(f *testing.F) {
	f.Add(uint16(8), uint16(512), uint8(8), uint8(0), uint16(256), uint16(1024), uint16(2048), false, uint8(0), uint8(0),
		uint8(2), uint8(2), uint8(2), uint8(2), uint8(1), uint8(1), uint8(2), uint8(4), uint8(1), true, uint8(1), uint8(3), uint8(1), uint8(2), uint8(0))
	f.Add(uint16(4), uint16(256), uint8(4), uint8(2), uint16(128), uint16(512), uint16(0), true, uint8(8), uint8(2),
		uint8(1), uint8(2), uint8(1), uint8(0), uint8(4), uint8(2), uint8(1), uint8(8), uint8(3), false, uint8(2), uint8(2), uint8(3), uint8(0), uint8(1))
	f.Fuzz(func(t *testing.T, layers, hidden uint16, heads, kvHeads uint8, seq, vocab, ffn uint16, gated bool, experts, moeLayers uint8,
		tp, pp, dp, vpp, ep, cp, mb, m, zero uint8, sp bool, recompute, precision, schedule, offload, cpImpl uint8) {
		shape := Transformer{Layers: int(layers % 97), Hidden: int(hidden), Heads: int(heads), KVHeads: int(kvHeads), Seq: int(seq), Vocab: int(vocab),
			FFN: int(ffn), GatedMLP: gated, FusedAttention: gated}
		if experts > 0 {
			shape.Experts, shape.MoELayers, shape.ExpertFFN, shape.Slots = int(experts%17), int(moeLayers%5), int(ffn)+1, float64(mb%3)+0.5
		}
		p := Plan{TP: int(tp % 17), PP: int(pp % 17), DP: int(dp % 65), VPP: int(vpp % 5), EP: int(ep % 9), CP: int(cp % 9),
			MicroBatch: int(mb % 9), Microbatches: int(m % 33), Zero: int(zero % 5), SequenceParallel: sp,
			Recompute:       []string{"none", "selective", "full", "every=2", "every=sqrt", "every=0", ""}[recompute%7],
			Precision:       []string{"fp32", "bf16", "fp16", "fp8", "int4"}[precision%5],
			Schedule:        []string{"", "1f1b", "gpipe", "interleaved", "zb", "2bw", "nope"}[schedule%7],
			Offload:         []string{"", "optimizer", "params", "optimizer,params"}[offload%4],
			CPImpl:          []string{"", "ring", "all2all"}[cpImpl%3],
			BucketBytes:     float64(m) * 1e5,
			OffloadPrefetch: int(vpp % 3)}
		h, err := Load("a100-80g")
		if err != nil {
			t.Fatal(err)
		}
		for _, simulate := range []bool{true, false} {
			price := h.Estimate
			if !simulate {
				price = h.EstimateFast
			}
			e, err := price(shape, p)
			if err != nil {
				continue
			}
			if !(e.StepSeconds > 0) || math.IsInf(e.StepSeconds, 0) {
				t.Fatalf("%+v under %s: step %g s", shape, p, e.StepSeconds)
			}
			if !(e.Bubble >= 0) || math.IsInf(e.Bubble, 0) {
				t.Fatalf("%+v under %s: bubble %g", shape, p, e.Bubble)
			}
			if e.MemoryLowerBound < 0 || e.MemoryEstimate <= 0 || e.MemoryEstimate < e.MemoryLowerBound {
				t.Fatalf("%+v under %s: memory estimate %d, lower bound %d", shape, p, e.MemoryEstimate, e.MemoryLowerBound)
			}
		}
	})
}
