package cost

import (
	"encoding/json"
	"errors"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/ir"
)

func TestPresetsValidate(t *testing.T) {
	for _, name := range []string{"a100-40g", "a100-80g", "h100-sxm", "h200", "cpu"} {
		h, err := Load(name)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if err := h.Validate(); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := Load("a100"); !errors.Is(err, ErrUnknownHardware) || !strings.Contains(err.Error(), `"a100" (did you mean a100-40g or a100-80g?)`) {
		t.Errorf("unknown preset: got %v", err)
	}
	for name, near := range map[string]string{"h100": "h100-sxm", "a100-80": "a100-80g", "H200": "h200"} {
		if _, err := Load(name); err == nil || !strings.Contains(err.Error(), "(did you mean "+near+"?)") {
			t.Errorf("%s: got %v, want a hint of %s", name, err, near)
		}
	}
	if _, err := Load("tpu"); err == nil || strings.Contains(err.Error(), "did you mean") {
		t.Errorf("tpu: got %v, want no hint", err)
	}
}

// TestLoadFile: a preset written out loads back equal; each malformed
// file is refused with ErrBadHardware and names its problem.
func TestLoadFile(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := `{"name": "mygpu", "peak_tflops": {"fp32": 50, "bf16": 400}, "vector_tflops": 50,
	  "memory_gib": 48, "memory_gbps": 1000, "intra_node_gbps": 100, "intra_node_latency_us": 5,
	  "inter_node_gbps": 25, "inter_node_latency_us": 10, "devices_per_node": 4, "host_gbps": 25,
	  "gemm_efficiency": 0.7, "gemm_half_us": 3, "mem_efficiency": 0.8, "mem_half_us": 2, "launch_us": 3}`
	h, err := Load(write("good.json", good))
	if err != nil {
		t.Fatal(err)
	}
	if h.Name != "mygpu" || h.Peak("bf16") != 400e12 || h.DevicesPerNode != 4 {
		t.Errorf("loaded %+v", h)
	}
	for _, c := range []struct{ name, text, want string }{
		{"unknown-key.json", strings.Replace(good, `"launch_us"`, `"launch_usec"`, 1), `unknown key "launch_usec"`},
		{"key-case.json", strings.Replace(good, `"launch_us"`, `"Launch_US"`, 1), `unknown key "Launch_US"`},
		{"missing-key.json", strings.Replace(good, `, "launch_us": 3`, ``, 1), "missing launch_us"},
		{"null-key.json", strings.Replace(good, `"launch_us": 3`, `"launch_us": null`, 1), "launch_us is null: a hardware file gives every figure"},
		{"twice.json", strings.Replace(good, `"launch_us": 3`, `"launch_us": 3, "launch_us": 4`, 1), `key "launch_us" given twice`},
		{"twice-nested.json", strings.Replace(good, `"bf16": 400`, `"bf16": 400, "bf16": 500`, 1), `key "bf16" in "peak_tflops" given twice`},
		{"trailing.json", good + ` {}`, "data after"},
		{"not-json.json", `peak = 5`, "not JSON at line 1, column 1: invalid character"},
		{"nan.json", strings.Replace(good, `"memory_gib": 48`, "\n\"memory_gib\": NaN", 1), "not JSON at line 3, column 15: invalid character 'N'"},
		{"a-list.json", `[]`, "the file is a JSON array, want a JSON object"},
		{"cut-short.json", good[:40], "the JSON ends before it is complete (is the file cut short?)"},
		{"empty.json", " \n", "the file is empty"},
		{"bom.json", "\xef\xbb\xbf" + good, "the file starts with a UTF-8 byte-order mark, which JSON does not allow: save it without one"},
		{"negative.json", strings.Replace(good, `"memory_gib": 48`, `"memory_gib": -1`, 1), "memory_gib must be positive"},
		{"huge.json", strings.Replace(good, `"memory_gib": 48`, `"memory_gib": 1e308`, 1), "memory_gib 1e+308 is beyond any device (at most 4294967296 GiB)"},
		{"efficiency.json", strings.Replace(good, `"gemm_efficiency": 0.7`, `"gemm_efficiency": 1.5`, 1), "gemm_efficiency must lie in (0, 1]"},
		{"dtype.json", strings.Replace(good, `"bf16": 400`, `"bf17": 400`, 1), `unknown dtype "bf17"`},
		{"no-fp32.json", strings.Replace(good, `"fp32": 50, `, ``, 1), "needs fp32"},
		{"node.json", strings.Replace(good, `"devices_per_node": 4`, `"devices_per_node": 0`, 1), "devices_per_node must be ≥ 1"},
		{"empty-name.json", strings.Replace(good, `"mygpu"`, `" "`, 1), "name must not be empty"},
		{"op-scale-op.json", strings.Replace(good, `"name": "mygpu",`, `"name": "mygpu", "op_scale": {"gelux": 2},`, 1), `op_scale: unknown op "gelux"`},
		{"op-scale-value.json", strings.Replace(good, `"name": "mygpu",`, `"name": "mygpu", "op_scale": {"gelu": 0},`, 1), "op_scale.gelu must be positive"},
	} {
		_, err := Load(write(c.name, c.text))
		if !errors.Is(err, ErrBadHardware) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want ErrBadHardware with %q", c.name, err, c.want)
		}
	}
	// A file that is not there is no description, bad or good: unknown
	// hardware, the file's error kept.
	if _, err := Load(filepath.Join(dir, "missing.json")); !errors.Is(err, ErrUnknownHardware) || !errors.Is(err, fs.ErrNotExist) || errors.Is(err, ErrBadHardware) {
		t.Errorf("missing file: got %v", err)
	}
}

// TestCollectives checks the α-β formulas against hand-computed values
// and that a group spanning nodes takes the inter-node link.
func TestCollectives(t *testing.T) {
	h, _ := Preset("a100-80g")
	intra, inter := h.LinkFor([]int{0, 1, 2, 3}), h.LinkFor([]int{6, 7, 8, 9})
	if intra.InterNode || !inter.InterNode {
		t.Fatalf("links: %+v %+v", intra, inter)
	}
	l := Link{GBps: 100, LatencyUS: 10}
	// Ring all-reduce of 1 GB over 4: 6 steps of 10 µs + 2·3/4·1e9/1e11 s.
	got := Collective("all_reduce", 4, 1e9, l)
	if want := 6*10e-6 + 1.5e-2; math.Abs(got-want) > 1e-12 {
		t.Errorf("all_reduce %g, want %g", got, want)
	}
	// A tiny all-reduce over 64 takes the tree: 2·6 latencies.
	if got, want := Collective("all_reduce", 64, 8, l), 12*10e-6+2*8/1e11; math.Abs(got-want) > 1e-12 {
		t.Errorf("tree all_reduce %g, want %g", got, want)
	}
	if got, want := Collective("all_gather", 8, 8e8, l), 7*10e-6+7.0/8*8e8/1e11; math.Abs(got-want) > 1e-12 {
		t.Errorf("all_gather %g, want %g", got, want)
	}
	if Collective("all_reduce", 1, 1e9, l) != 0 {
		t.Error("a group of one moves nothing")
	}
}

// TestGEMMEfficiencyGrows: a larger GEMM runs closer to peak.
func TestGEMMEfficiencyGrows(t *testing.T) {
	h, _ := Preset("h100-sxm")
	small := h.gemm(256, 256, 256, "bf16", 2)
	large := h.gemm(8192, 8192, 8192, "bf16", 2)
	effSmall := 2 * 256 * 256 * 256 / small / h.Peak("bf16")
	effLarge := 2 * 8192.0 * 8192 * 8192 / large / h.Peak("bf16")
	if !(effSmall < effLarge && effLarge <= h.GEMMEfficiency && effLarge > 0.75) {
		t.Errorf("efficiency small %.3f large %.3f", effSmall, effLarge)
	}
}

// TestLinkForSpreadsOverCards: a group spanning nodes crosses them on the
// cards of its members on each node (k·inter_node_gbps, at most NVLink):
// one member a node gets one card's 25 GB/s on a100-80g, two get 50, a
// whole node's eight get 200; a group inside a node gets NVLink (the
// all-reduce bus bandwidth NCCL measures on it).
func TestLinkForSpreadsOverCards(t *testing.T) {
	h, _ := Preset("a100-80g")
	every := func(n, stride int) []int {
		r := make([]int, n)
		for i := range r {
			r[i] = i * stride
		}
		return r
	}
	for _, c := range []struct {
		ranks []int
		gbps  float64
		inter bool
	}{
		{every(32, 8), 25, true},   // dp over tp-8 replicas
		{every(32, 4), 50, true},   // tp 4
		{every(32, 1), 200, true},  // tp 1: every GPU of 4 nodes
		{every(8, 1), 230, false},  // one node
		{[]int{7, 8}, 25, true},    // neighbours across a node boundary
		{[]int{0, 1, 8}, 25, true}, // the least-populated node decides
	} {
		l := h.LinkFor(c.ranks)
		if l.GBps != c.gbps || l.InterNode != c.inter {
			t.Errorf("LinkFor(%v) = %+v, want %g GB/s (inter-node %v)", c.ranks, l, c.gbps, c.inter)
		}
	}
}

// TestPresetForGPU: the planner's default preset follows the name the
// CUDA driver gives the GPU, and names none for a GPU it does not
// describe (the CLI then asks for --hardware).
func TestPresetForGPU(t *testing.T) {
	for name, want := range map[string]string{
		"NVIDIA H100 80GB HBM3":   "h100-sxm",
		"NVIDIA H200":             "h200",
		"NVIDIA A100-SXM4-80GB":   "a100-80g",
		"NVIDIA A100-SXM4-40GB":   "a100-40g",
		"NVIDIA H100 PCIe":        "",
		"NVIDIA A100 80GB PCIe":   "",
		"NVIDIA GeForce RTX 4090": "",
		"Tesla V100-SXM2-32GB":    "",
	} {
		if got := PresetForGPU(name); got != want {
			t.Errorf("PresetForGPU(%q) = %q, want %q", name, got, want)
		}
		if want != "" {
			if _, err := Preset(want); err != nil {
				t.Errorf("%q maps to %q, which is no preset: %v", name, want, err)
			}
		}
	}
}

// TestAxisLinkIsTheSlowestGroup: an axis is priced by its slowest group,
// not rank 0's: tp 3 on nodes of 4 keeps ranks 0–2 inside a node, but
// ranks 3–5 straddle two nodes; tp 4 fits every node; a pipeline transfer
// 6 ranks apart stays inside a node of 8 for rank 0 and crosses for rank 2.
func TestAxisLinkIsTheSlowestGroup(t *testing.T) {
	h, err := Preset("a100-80g")
	if err != nil {
		t.Fatal(err)
	}
	h.DevicesPerNode = 4
	if l := h.LinkFor([]int{0, 1, 2}); l.InterNode {
		t.Fatal("rank 0's tp 3 group is inside node 0")
	}
	if l := h.axisLink(3, 1, 12); !l.InterNode {
		t.Errorf("tp 3 on nodes of 4: some group straddles two nodes, got %+v", l)
	}
	if l := h.axisLink(4, 1, 12); l.InterNode {
		t.Errorf("tp 4 on nodes of 4 stays inside nodes, got %+v", l)
	}
	if l := h.axisLink(2, 4, 8); !l.InterNode || l.GBps != h.InterGBps {
		t.Errorf("dp 2 over tp 4: one member per node, one card's share, got %+v", l)
	}
	h.DevicesPerNode = 8
	if l := h.pairLink(6, 16); !l.InterNode {
		t.Errorf("a transfer 6 ranks apart on nodes of 8 crosses for ranks 2→8, got %+v", l)
	}
	if l := h.pairLink(8, 16); !l.InterNode {
		t.Errorf("a transfer 8 ranks apart always crosses, got %+v", l)
	}
	if l := h.pairLink(4, 16); !l.InterNode {
		t.Errorf("4 apart: ranks 4→8 cross, got %+v", l)
	}
}

// TestLoadSetsFigures: --hardware NAME:key=value,… sets numeric figures of
// a preset or file by their JSON keys; an unknown key, a non-number or a
// figure Validate refuses is a named error.
func TestLoadSetsFigures(t *testing.T) {
	h, err := Load("a100-80g:inter_node_gbps=12.5, host_op_us=35,devices_per_node=4")
	if err != nil {
		t.Fatal(err)
	}
	if h.InterGBps != 12.5 || h.HostOpUS != 35 || h.DevicesPerNode != 4 || h.IntraGBps != 230 {
		t.Errorf("got inter %g, host %g, devices a node %d, intra %g", h.InterGBps, h.HostOpUS, h.DevicesPerNode, h.IntraGBps)
	}
	if !strings.Contains(h.Source, "set on the command line") {
		t.Errorf("source %q does not say what was set", h.Source)
	}
	// A file whose path has a colon is a file, not a figure set.
	h100, err := Preset("h100-sxm")
	if err != nil {
		t.Fatal(err)
	}
	data, err := json.Marshal(h100)
	if err != nil {
		t.Fatal(err)
	}
	colon := filepath.Join(t.TempDir(), "rack:7.json")
	if err := os.WriteFile(colon, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := Load(colon); err != nil || got.Name != "h100-sxm" {
		t.Errorf("Load(%q) = %v, %v", colon, got, err)
	}
	plain := filepath.Join(t.TempDir(), "mine.json")
	if err := os.WriteFile(plain, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := Load(plain + ":host_op_us=5"); err != nil || got.HostOpUS != 5 || got.Name != "h100-sxm" {
		t.Errorf("Load(%q) = %v, %v", plain+":host_op_us=5", got, err)
	}
	for spec, want := range map[string]string{
		"a100-80g:nvlink=400":                              `"nvlink=400": want key=value with a numeric key`,
		"a100-80g:name=x":                                  `"name=x": want key=value`,
		"a100-80g:inter_node_gbps":                         `"inter_node_gbps": want key=value`,
		"a100-80g:inter_node_gbps=fast":                    `inter_node_gbps="fast" is not a number`,
		"a100-80g:devices_per_node=2.5":                    `devices_per_node="2.5" is not a whole number`,
		"a100-80g:gemm_efficiency=1.5":                     "gemm_efficiency must lie in (0, 1], got 1.5",
		"a100-80g:gemm_efficiency=5e-324":                  "gemm_efficiency must be at least 0.001",
		"a100-80g:mem_efficiency=1e-300":                   "mem_efficiency must be at least 0.001",
		"a100-80g:host_op_us=-1":                           "host_op_us must be finite and ≥ 0, got -1",
		"a100-80g:host_op_us=1e308":                        "host_op_us must be at most 1e+06 µs (a second), got 1e+308",
		"a100-80g:inter_node_gbps=1e-30":                   "inter_node_gbps must lie in [1e-06, 1e+09], got 1e-30",
		"a100-81g:inter_node_gbps=12":                      `unknown hardware "a100-81g"`,
		"a100-80g:overlap_buckets=maybe":                   `overlap_buckets="maybe" is not true or false`,
		"a100-80g:inter_node_gbps=12.5,inter_node_gbps=25": `inter_node_gbps given twice in "inter_node_gbps=12.5,inter_node_gbps=25"`,
	} {
		_, err := Load(spec)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Load(%q) = %v, want an error containing %q", spec, err, want)
		}
	}
}

// An op_scale below 1 on a GEMM (a hand-edited or fitted description)
// prices it faster than its curve, never faster than the peak: the MFU
// stays at most 100 %.
func TestOpScaleNeverBeatsThePeak(t *testing.T) {
	h, err := Preset("a100-80g")
	require.NoError(t, err)
	h.OpScale = map[string]float64{"matmul": 1e-6}
	const flops = int64(1) << 40
	floor := float64(flops) / h.Peak("bf16")
	assert.GreaterOrEqual(t, h.OpTime("matmul", ir.BF16, flops, 0), floor)
	assert.Less(t, h.OpTime("matmul", ir.BF16, flops, 0), 1.01*floor+h.LaunchUS*1e-6)
}
