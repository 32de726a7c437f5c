// Package cost predicts how long a training step takes and how much it
// moves, for a compiled plan (per-device lower.Programs and the pipeline
// schedule) or, before anything is compiled, for a transformer's shape
// under a candidate plan (analytic.go). Every figure comes from a
// Hardware description: a preset from datasheets, a JSON file the user
// writes, or the CPU backend measured on the machine it runs on.
//
// The model is deliberately simple and stated in full in
// docs/architecture.md ("Cost model and planner"): an op is a roofline
// (compute at an achieved fraction of peak that grows with the op's size,
// or memory traffic at an achieved fraction of bandwidth, whichever is
// slower, plus a launch overhead); a collective is α-β by algorithm, at
// the bandwidth of the slowest link its group spans; a pipeline step is
// the schedule simulator run with per-action costs.
package cost

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"os"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"

	"gcompile/internal/jsonerr"
	"gcompile/ir"
)

// Hardware is one kind of device and how devices are connected. Rates are
// per device and per direction; latencies are the fixed cost of one step
// of a collective algorithm (α) on that link.
type Hardware struct {
	Name   string `json:"name"`
	Source string `json:"source,omitempty"` // where the figures come from
	// PeakTFLOPS is the dense peak per dtype ("fp32", "bf16", "fp16",
	// "fp8" where the GPU has FP8 tensor cores, "f64"), in TFLOP/s, for
	// matrix multiplies; VectorTFLOPS the peak of elementwise arithmetic
	// (GPUs: the fp32 CUDA cores).
	PeakTFLOPS   map[string]float64 `json:"peak_tflops"`
	VectorTFLOPS float64            `json:"vector_tflops"`
	// MemoryGiB is the device memory; MemoryGBps its bandwidth.
	MemoryGiB  float64 `json:"memory_gib"`
	MemoryGBps float64 `json:"memory_gbps"`
	// Intra-node links (NVLink/NVSwitch) and inter-node links (the
	// InfiniBand share of one device), GB/s per direction, latency in µs.
	IntraGBps      float64 `json:"intra_node_gbps"`
	IntraLatencyUS float64 `json:"intra_node_latency_us"`
	InterGBps      float64 `json:"inter_node_gbps"`
	InterLatencyUS float64 `json:"inter_node_latency_us"`
	DevicesPerNode int     `json:"devices_per_node"`
	// HostGBps is the host link offloaded buffers cross (PCIe).
	HostGBps float64 `json:"host_gbps"`

	// Achieved efficiency. A GEMM of f flops runs at
	// GEMMEfficiency·f/(f + F½) of peak, F½ = peak·GEMMHalfUS: small GEMMs
	// cannot fill the machine. Memory-bound ops reach MemEfficiency of
	// the bandwidth on large tensors, half of that at MemHalfUS' worth of
	// traffic. Every kernel pays LaunchUS.
	GEMMEfficiency float64 `json:"gemm_efficiency"`
	GEMMHalfUS     float64 `json:"gemm_half_us"`
	MemEfficiency  float64 `json:"mem_efficiency"`
	MemHalfUS      float64 `json:"mem_half_us"`
	LaunchUS       float64 `json:"launch_us"`
	// HostOpUS is the host's time to issue one kernel in the framework
	// that runs the step, a floor under every kernel the estimates price
	// (Estimate's and Predict's): an eager framework (PyTorch running Megatron-LM or
	// DeepSpeed) spends tens of µs of Python and dispatch per op, so once
	// a kernel's device time falls below it the device waits on the host
	// (small microbatches, wide tp, small models). 0: no floor.
	HostOpUS float64 `json:"host_op_us,omitempty"`
	// HostCores, when > 0, says the devices are virtual devices sharing
	// this many host cores (the CPU backend): devices then compete for
	// cores, and a step takes at least the whole work over the cores.
	HostCores int `json:"host_cores,omitempty"`
	// OverlapBuckets says the runtime reduces data-parallel gradient
	// buckets (all-reduce, or ZeRO's reduce-scatter) on a stream of
	// their own while the backward
	// goes on, as the CUDA backend does; without it they run in program
	// order on the compute stream, as on the CPU backend.
	OverlapBuckets bool `json:"overlap_buckets,omitempty"`
	// OpScale multiplies the roofline time (beyond the launch) of the
	// named ops: what a backend's kernel for that op reaches against the
	// roofline of its flops and bytes (the CPU backend's scalar GELU or
	// cross-entropy are far from the memory bound a copy reaches). Refine
	// fits it from a trace; a missing op is 1. A GEMM's scaled time is
	// never below its flops at the peak.
	OpScale map[string]float64 `json:"op_scale,omitempty"`

	// given are the keys set on the command line (--hardware NAME:key=v):
	// figures the user knows, which a calibration keeps.
	given map[string]bool
}

// Errors of a hardware description, so callers can tell a missing preset
// from a malformed file.
var (
	ErrUnknownHardware = errors.New("unknown hardware")
	ErrBadHardware     = errors.New("bad hardware description")
)

// presets are datasheet figures (see docs/architecture.md for the
// sources). Efficiencies are what published measurements achieve, not
// fitted to any run: ~80 % of peak for large bf16 GEMMs (REFERENCE.md: an
// 8192³ GEMM reaches ~790 of H100's 989 TFLOP/s), ~85 % of HBM bandwidth.
var presets = map[string]Hardware{
	"a100-40g": a100("a100-40g", "SXM4 40GB", 40, 1555),
	"a100-80g": a100("a100-80g", "SXM4 80GB", 80, 2039),
	"h100-sxm": hopper("h100-sxm", "NVIDIA H100 datasheet (SXM5 80GB, dense); DGX H100", 80, 3350),
	"h200":     hopper("h200", "NVIDIA H200 datasheet (SXM 141GB, dense); HGX H200", 140, 4800),
	// cpu is the CPU backend before calibration: virtual devices in one
	// process sharing the host's cores and memory, each kernel using every
	// core (hence host_cores 1). Calibrate (calibrate.go) replaces the
	// rates with ones measured on the machine; the CLI does so when
	// --hardware cpu is given.
	"cpu": {
		Name: "cpu", Source: "CPU backend, uncalibrated defaults (--hardware cpu measures this machine: cost.Calibrate)",
		PeakTFLOPS: map[string]float64{"fp32": 0.02, "bf16": 0.01, "fp16": 0.01, "f64": 0.01}, VectorTFLOPS: 0.002,
		MemoryGiB: 16, MemoryGBps: 5, IntraGBps: 3, IntraLatencyUS: 20, InterGBps: 1, InterLatencyUS: 100, DevicesPerNode: 1 << 20, HostGBps: 5,
		GEMMEfficiency: 1, GEMMHalfUS: 20, MemEfficiency: 1, MemHalfUS: 1, LaunchUS: 0.5, HostCores: 1,
	},
}

// a100 and hopper are the A100 and H100/H200 presets, which differ only
// in memory within a generation: the same GPU die, NVLink and network.
//
// The A100's NVLink figures are what NCCL reaches on it, not the
// datasheet's 300 GB/s a direction: nccl-tests' all_reduce_perf on the 8
// A100 SXM of one node (the measured tables the vTrain simulator ships,
// github.com/VIA-Research/vTrain trace/a100/AR_GPU8_1M_1024M_LUT) gives a
// bus bandwidth of 229 GB/s at 1 GiB and 93 µs at 1 MiB, which a ring's
// α-β fits with 230 GB/s and 6 µs a step (at 32 MiB, a tp all-reduce's
// size: 358 µs measured, 328 predicted). The H100's stay the datasheet's
// 450 GB/s, which the 460–480 GB/s bus bandwidth cloud operators report
// for nccl-tests on 8 H100 SXM (NVLink SHARP reducing in the switch; e.g.
// Alaya NeW's NCCL-tests guide, 2026) bears out; no latency was at hand.
func a100(name, board string, memGiB, memGBps float64) Hardware {
	return Hardware{
		Name: name, Source: "NVIDIA A100 datasheet (" + board + "); DGX A100: 8 GPUs, NVLink3 600 GB/s bidirectional (all-reduce bus bandwidth 230 GB/s measured by nccl-tests), 8x HDR 200 Gb/s",
		PeakTFLOPS: map[string]float64{"fp32": 19.5, "tf32": 156, "bf16": 312, "fp16": 312, "f64": 19.5}, VectorTFLOPS: 19.5,
		MemoryGiB: memGiB, MemoryGBps: memGBps, IntraGBps: 230, IntraLatencyUS: 6, InterGBps: 25, InterLatencyUS: 10, DevicesPerNode: 8, HostGBps: 25,
		GEMMEfficiency: 0.8, GEMMHalfUS: 3, MemEfficiency: 0.85, MemHalfUS: 2, LaunchUS: 3, OverlapBuckets: true,
	}
}

func hopper(name, source string, memGiB, memGBps float64) Hardware {
	return Hardware{
		Name: name, Source: source + ": 8 GPUs, NVLink4 900 GB/s bidirectional, 8x NDR 400 Gb/s",
		PeakTFLOPS: map[string]float64{"fp32": 67, "tf32": 494, "bf16": 989, "fp16": 989, "fp8": 1979, "f64": 67}, VectorTFLOPS: 67,
		MemoryGiB: memGiB, MemoryGBps: memGBps, IntraGBps: 450, IntraLatencyUS: 4, InterGBps: 50, InterLatencyUS: 8, DevicesPerNode: 8, HostGBps: 50,
		GEMMEfficiency: 0.8, GEMMHalfUS: 3, MemEfficiency: 0.85, MemHalfUS: 2, LaunchUS: 3, OverlapBuckets: true,
	}
}

// PresetForGPU is the preset that describes a GPU by the name its driver
// gives it, "" when none does: an H200, an H100 in SXM form (the PCIe
// card has other clocks and links), an A100 of 80 or 40 GB.
func PresetForGPU(name string) string {
	n := strings.ToUpper(name)
	switch {
	case strings.Contains(n, "H200"):
		return "h200"
	case strings.Contains(n, "H100") && !strings.Contains(n, "PCIE") && !strings.Contains(n, "NVL"):
		return "h100-sxm"
	case strings.Contains(n, "A100") && !strings.Contains(n, "PCIE") && strings.Contains(n, "80GB"):
		return "a100-80g"
	case strings.Contains(n, "A100") && !strings.Contains(n, "PCIE"):
		return "a100-40g"
	}
	return ""
}

// Presets lists the preset names, sorted.
func Presets() []string {
	names := make([]string, 0, len(presets))
	for n := range presets {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Preset returns a copy of the named preset.
func Preset(name string) (*Hardware, error) {
	h, ok := presets[name]
	if !ok {
		var near []string
		for _, p := range Presets() {
			if l := strings.ToLower(name); l != "" && (strings.HasPrefix(p, l) || strings.HasPrefix(l, p)) {
				near = append(near, p)
			}
		}
		hint := ""
		if len(near) > 0 {
			hint = " (did you mean " + strings.Join(near, " or ") + "?)"
		}
		return nil, fmt.Errorf("%w %q%s: want one of %s, or a JSON file (NAME.json)", ErrUnknownHardware, name, hint, strings.Join(Presets(), ", "))
	}
	h.PeakTFLOPS = maps.Clone(h.PeakTFLOPS)
	return &h, nil
}

// Load reads --hardware: a preset name or a path ending in .json,
// optionally followed by ":key=value,…" that sets numeric figures by
// their JSON keys (a100-80g:inter_node_gbps=12.5,host_op_us=45: the
// preset on a cluster with half a DGX's network, priced for an eager
// framework), so a known difference needs no file.
func Load(spec string) (*Hardware, error) {
	if strings.HasSuffix(strings.ToLower(spec), ".json") {
		return LoadFile(spec) // a path, colons and all
	}
	base, sets, hasSets := strings.Cut(spec, ":")
	var h *Hardware
	var err error
	if strings.HasSuffix(strings.ToLower(base), ".json") {
		h, err = LoadFile(base)
	} else {
		h, err = Preset(base)
		if fi, serr := os.Stat(base); err != nil && serr == nil {
			// A path, not a preset's name: say what it is.
			what := "a file not named NAME.json"
			if fi.IsDir() {
				what = "a folder"
			}
			err = fmt.Errorf("%w %q: %s, neither a preset (%s) nor a hardware file (NAME.json)", ErrUnknownHardware, base, what, strings.Join(Presets(), ", "))
		}
	}
	if err != nil || !hasSets {
		return h, err
	}
	return h.With(sets)
}

// With is h with the figures of "key=value,…" set, validated.
func (h *Hardware) With(sets string) (*Hardware, error) {
	fields := scalarFields(h)
	seen := map[string]bool{}
	for _, set := range strings.Split(sets, ",") {
		key, val, ok := strings.Cut(set, "=")
		key = strings.TrimSpace(key)
		f, known := fields[key]
		if !ok || !known {
			return nil, fmt.Errorf("%w: %q: want key=value with a numeric key of the hardware JSON (%s)", ErrBadHardware, set, strings.Join(slices.Sorted(maps.Keys(fields)), ", "))
		}
		if seen[key] {
			// As a file's key given twice: which one was meant?
			return nil, fmt.Errorf("%w: %s given twice in %q", ErrBadHardware, key, sets)
		}
		seen[key] = true
		val = strings.TrimSpace(val)
		switch f.Kind() {
		case reflect.Float64:
			x, err := strconv.ParseFloat(val, 64)
			if err != nil || strings.Contains(val, "_") {
				return nil, fmt.Errorf("%w: %s=%q is not a number", ErrBadHardware, key, val)
			}
			f.SetFloat(x)
		case reflect.Int:
			x, err := strconv.Atoi(val)
			if err != nil {
				return nil, fmt.Errorf("%w: %s=%q is not a whole number", ErrBadHardware, key, val)
			}
			f.SetInt(int64(x))
		case reflect.Bool:
			x, err := strconv.ParseBool(val)
			if err != nil {
				return nil, fmt.Errorf("%w: %s=%q is not true or false", ErrBadHardware, key, val)
			}
			f.SetBool(x)
		}
	}
	h.Source += "; set on the command line: " + sets
	h.given = seen
	if err := h.Validate(); err != nil {
		return nil, err
	}
	return h, nil
}

// scalarFields are h's figures that "key=value" sets, by JSON key: its
// numbers and switches.
func scalarFields(h *Hardware) map[string]reflect.Value {
	fields := map[string]reflect.Value{}
	v := reflect.ValueOf(h).Elem()
	for i := range v.NumField() {
		if !v.Type().Field(i).IsExported() {
			continue
		}
		key, _, _ := strings.Cut(v.Type().Field(i).Tag.Get("json"), ",")
		switch v.Field(i).Kind() {
		case reflect.Float64, reflect.Int, reflect.Bool:
			fields[key] = v.Field(i)
		}
	}
	return fields
}

// LoadFile reads a hardware description from a JSON file. Unknown fields
// are errors (a misspelt key would otherwise silently keep its zero), and
// so is trailing data; Validate then checks every figure.
func LoadFile(path string) (*Hardware, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		// Not a bad description but none: the file's error says why
		// (fs.ErrNotExist stays reachable), under ErrUnknownHardware.
		return nil, fmt.Errorf("%w: %w (a hardware file is a JSON object, as --save-hardware writes one; or name a preset: %s)", ErrUnknownHardware, err, strings.Join(Presets(), ", "))
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, fmt.Errorf("%w: %s: the file is empty (a hardware file is a JSON object, as --save-hardware writes one)", ErrBadHardware, path)
	}
	var doc json.RawMessage
	if err := json.Unmarshal(data, &doc); err != nil {
		// Its syntax first: a syntax error's offset is the document's
		// here, where a token reader's is its buffer's.
		return nil, fmt.Errorf("%w: %s: %v", ErrBadHardware, path, jsonerr.Decode(data, err))
	}
	if err := checkKeys(data); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrBadHardware, path, jsonerr.Decode(data, err))
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var h Hardware
	if err := dec.Decode(&h); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrBadHardware, path, jsonerr.Decode(data, err))
	}
	if dec.More() {
		return nil, fmt.Errorf("%w: %s: data after the JSON object", ErrBadHardware, path)
	}
	if err := h.Validate(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &h, nil
}

// hardwareKeys are the JSON keys of Hardware, each saying whether a file
// must give it: every figure Save writes (the omitempty ones default to
// zero, which means "none").
var hardwareKeys = func() map[string]bool {
	keys := map[string]bool{}
	t := reflect.TypeFor[Hardware]()
	for i := range t.NumField() {
		if !t.Field(i).IsExported() {
			continue // given: which keys the command line set, not a figure
		}
		name, opts, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		keys[name] = opts != "omitempty"
	}
	return keys
}()

// checkKeys checks a hardware file's keys as encoding/json does not: each
// top-level key exactly one of Hardware's (json matches a key in any
// case, so "Launch_US" would set launch_us), none given twice at any depth
// (json keeps the last, silently), and none of the required ones missing
// (json leaves it zero: a launch cost of 0 µs, not an error).
func checkKeys(data []byte) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	top := map[string]bool{}
	var walk func(depth int, path string) (null bool, err error)
	walk = func(depth int, path string) (bool, error) {
		tok, err := dec.Token()
		if err != nil {
			return false, err
		}
		d, ok := tok.(json.Delim)
		if !ok {
			return tok == nil, nil
		}
		switch d {
		case '[':
			for dec.More() {
				if _, err := walk(depth+1, path+"[]"); err != nil {
					return false, err
				}
			}
		case '{':
			seen := map[string]bool{}
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return false, err
				}
				k, _ := kt.(string)
				if seen[k] {
					return false, fmt.Errorf("key %q%s given twice", k, path)
				}
				seen[k] = true
				if depth == 0 {
					if _, known := hardwareKeys[k]; !known {
						return false, fmt.Errorf("unknown key %q (the keys are %s; their case matters)", k, strings.Join(slices.Sorted(maps.Keys(hardwareKeys)), ", "))
					}
				}
				null, err := walk(depth+1, fmt.Sprintf(" in %q", k))
				if err != nil {
					return false, err
				}
				if depth == 0 && null && hardwareKeys[k] {
					// json leaves null as zero: a figure of 0, not a missing one.
					return false, fmt.Errorf("%s is null: a hardware file gives every figure", k)
				}
				if depth == 0 {
					top[k] = true
				}
			}
		}
		_, err = dec.Token() // the closing delimiter
		return false, err
	}
	if _, err := walk(0, ""); err != nil {
		return err
	}
	if len(top) == 0 {
		return nil // not an object: the decoder says what it is
	}
	var missing []string
	for k, required := range hardwareKeys {
		if required && !top[k] {
			missing = append(missing, k)
		}
	}
	if len(missing) > 0 {
		slices.Sort(missing)
		return fmt.Errorf("missing %s: a hardware file gives every figure (--save-hardware writes one; a preset with :key=value sets a few)", strings.Join(missing, ", "))
	}
	return nil
}

// Validate checks that every figure is usable: positive and finite where
// it divides, fractions in (0, 1], a known dtype for each peak. Each
// problem is named by its JSON key.
func (h *Hardware) Validate() error {
	var errs []string
	bad := func(format string, args ...any) { errs = append(errs, fmt.Sprintf(format, args...)) }
	// Rates and fixed costs are bounded far past any device, so that no
	// figure prices a step at an infinite or zero time.
	pos := func(key string, v float64) {
		switch {
		case !(v > 0) || math.IsInf(v, 0):
			bad("%s must be positive and finite, got %g", key, v)
		case v < minRate || v > maxRate:
			bad("%s must lie in [%g, %g], got %g", key, minRate, maxRate, v)
		}
	}
	nonNeg := func(key string, v float64) {
		switch {
		case !(v >= 0) || math.IsInf(v, 0):
			bad("%s must be finite and ≥ 0, got %g", key, v)
		case v > maxFixedUS:
			bad("%s must be at most %g µs (a second), got %g", key, float64(maxFixedUS), v)
		}
	}
	// An efficiency near 0 prices every kernel at an infinite time (a
	// step of +Inf or 1e302 ms); 0.1 % is below any device's.
	frac := func(key string, v float64) {
		switch {
		case !(v > 0 && v <= 1):
			bad("%s must lie in (0, 1], got %g", key, v)
		case v < minEfficiency:
			bad("%s must be at least %g (no device runs its kernels at a thousandth of its peak), got %g", key, minEfficiency, v)
		}
	}
	if strings.TrimSpace(h.Name) == "" {
		bad("name must not be empty")
	}
	if len(h.PeakTFLOPS) == 0 {
		bad("peak_tflops needs at least fp32")
	}
	keys := make([]string, 0, len(h.PeakTFLOPS))
	for k := range h.PeakTFLOPS {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if !slices.Contains([]string{"fp32", "tf32", "bf16", "fp16", "fp8", "f64"}, k) {
			bad("peak_tflops: unknown dtype %q (want fp32, tf32, bf16, fp16, fp8, f64)", k)
			continue
		}
		pos("peak_tflops."+k, h.PeakTFLOPS[k])
	}
	if _, ok := h.PeakTFLOPS["fp32"]; !ok && len(h.PeakTFLOPS) > 0 {
		bad("peak_tflops needs fp32")
	}
	opKeys := slices.Sorted(maps.Keys(h.OpScale))
	for _, op := range opKeys {
		if _, ok := ir.Lookup(op); !ok {
			bad("op_scale: unknown op %q", op)
			continue
		}
		pos("op_scale."+op, h.OpScale[op])
	}
	pos("vector_tflops", h.VectorTFLOPS)
	pos("memory_gib", h.MemoryGiB)
	if h.MemoryGiB > maxMemoryGiB {
		// Its bytes would overflow the int64 the memory plan counts in.
		bad("memory_gib %g is beyond any device (at most %d GiB)", h.MemoryGiB, maxMemoryGiB)
	}
	pos("memory_gbps", h.MemoryGBps)
	pos("intra_node_gbps", h.IntraGBps)
	pos("inter_node_gbps", h.InterGBps)
	pos("host_gbps", h.HostGBps)
	nonNeg("intra_node_latency_us", h.IntraLatencyUS)
	nonNeg("inter_node_latency_us", h.InterLatencyUS)
	nonNeg("gemm_half_us", h.GEMMHalfUS)
	nonNeg("mem_half_us", h.MemHalfUS)
	nonNeg("launch_us", h.LaunchUS)
	nonNeg("host_op_us", h.HostOpUS)
	frac("gemm_efficiency", h.GEMMEfficiency)
	frac("mem_efficiency", h.MemEfficiency)
	if h.DevicesPerNode < 1 {
		bad("devices_per_node must be ≥ 1, got %d", h.DevicesPerNode)
	}
	if h.HostCores < 0 {
		bad("host_cores must be ≥ 0, got %d", h.HostCores)
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %s", ErrBadHardware, strings.Join(errs, "; "))
	}
	return nil
}

// minRate and maxRate bound every rate of a description (TFLOP/s, GB/s,
// op_scale): a kilobyte a second to an exabyte a second.
const minRate, maxRate = 1e-6, 1e9

// minEfficiency bounds gemm_efficiency and mem_efficiency from below.
const minEfficiency = 1e-3

// maxFixedUS bounds every fixed cost (latencies, launch and host time a
// kernel, half-efficiency sizes): a second.
const maxFixedUS = 1e6

// maxMemoryGiB bounds a device's memory: 2^32 GiB (4 EiB) is far past
// any device and its bytes still fit an int64.
const maxMemoryGiB = 1 << 32

// MemoryBytes is the device memory in bytes.
func (h *Hardware) MemoryBytes() int64 { return int64(h.MemoryGiB * (1 << 30)) }

// Peak is the matrix peak in FLOP/s for a dtype name ("f32" and "fp32"
// alike); an unknown dtype falls back to fp32.
func (h *Hardware) Peak(dtype string) float64 {
	switch dtype {
	case "f32":
		dtype = "fp32"
	case "f16":
		dtype = "fp16"
	}
	if v, ok := h.PeakTFLOPS[dtype]; ok {
		return v * 1e12
	}
	return h.PeakTFLOPS["fp32"] * 1e12
}
