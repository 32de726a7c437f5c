package cost_test

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"testing"
	"time"

	"gcompile/compile"
	"gcompile/cost"
	"gcompile/examples/gpt"
	"gcompile/frontend"
	"gcompile/ir"
	"gcompile/lower"
	"gcompile/passes"
	"gcompile/runtime"
)

// compileGPT compiles the reference GPT at test size (2 layers, h 32, 4
// heads, seq 16, batch 8) on 4 devices under the given degrees.
func compileGPT(t *testing.T, tp, pp, microbatches int) *compile.Result {
	t.Helper()
	return compileGPTBuckets(t, tp, pp, microbatches, 25)
}

// compileGPTBuckets is compileGPT with gradient buckets of bucketMB.
func compileGPTBuckets(t *testing.T, tp, pp, microbatches int, bucketMB float64) *compile.Result {
	t.Helper()
	return compileGPTWith(t, func(c *compile.Config) {
		c.TP, c.PP, c.Microbatches, c.BucketMB = tp, pp, microbatches, bucketMB
	})
}

// compileGPTWith compiles the tiny GPT for 4 devices, fp32, with edit's
// changes to the configuration.
func compileGPTWith(t *testing.T, edit func(*compile.Config)) *compile.Result {
	t.Helper()
	m, err := frontend.Build(gpt.Model, frontend.Config{Name: "gpt", Batch: 8,
		Set: map[string]string{"layers": "2", "hidden": "32", "heads": "4", "seq": "16"}})
	if err != nil {
		t.Fatal(err)
	}
	gir := filepath.Join(t.TempDir(), "gpt.gir")
	if err := os.WriteFile(gir, []byte(ir.Print(m)), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := compile.Config{Model: gir, Batch: 8, Devices: 4, TP: 1, PP: 1, Microbatches: 1,
		Precision: "fp32", Optimizer: "adamw", Beta1: 0.9, Beta2: 0.95, WeightDecay: 0.1, Clip: 1,
		Explicit: map[string]bool{}}
	edit(&cfg)
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	res, err := compile.Compile(&cfg, passes.Hooks{})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

type event struct {
	Name, Cat, Ph string
	Ts, Dur       float64
	Pid, Tid      int
	Args          map[string]any
}

func readTrace(t *testing.T, path string) ([]event, []map[string]any) {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var typed struct{ TraceEvents []event }
	var loose struct{ TraceEvents []map[string]any }
	if err := json.Unmarshal(raw, &typed); err != nil {
		t.Fatalf("%s is no JSON trace: %v", path, err)
	}
	if err := json.Unmarshal(raw, &loose); err != nil {
		t.Fatal(err)
	}
	return typed.TraceEvents, loose.TraceEvents
}

// TestPredictedTrace: the predicted trace of a pipeline (tp 2, pp 2, 4
// microbatches) and of a plan without one is valid Chrome trace JSON with
// one slice per instruction on each device's track, named by its op and
// in issue order without overlap, collectives marked "comm" with their
// axis, one slice per schedule action holding its block's instructions,
// and its last slice ends at the predicted step.
func TestPredictedTrace(t *testing.T) {
	hw, err := cost.Preset("a100-80g")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name            string
		tp, pp, microbs int
	}{{"tp2 pp2", 2, 2, 4}, {"tp2 dp2", 2, 1, 1}} {
		t.Run(c.name, func(t *testing.T) {
			res := compileGPT(t, c.tp, c.pp, c.microbs)
			pred, err := hw.Predict(res.Programs, res.Schedule)
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(t.TempDir(), "predicted.json")
			if err := cost.WriteTrace(path, res.Programs, pred); err != nil {
				t.Fatal(err)
			}
			events, _ := readTrace(t, path)
			names := map[int]string{}
			perTrack := map[[2]int][]event{}
			var end float64
			for _, e := range events {
				switch e.Ph {
				case "M":
					if e.Name == "process_name" {
						names[e.Pid] = e.Args["name"].(string)
					}
				case "X":
					if e.Dur < 0 || e.Ts < 0 || math.IsNaN(e.Dur) {
						t.Fatalf("slice %+v", e)
					}
					perTrack[[2]int{e.Pid, e.Tid}] = append(perTrack[[2]int{e.Pid, e.Tid}], e)
					end = math.Max(end, e.Ts+e.Dur)
				default:
					t.Fatalf("unexpected phase %q", e.Ph)
				}
			}
			if names[2] != "predicted kernels" || names[3] != "predicted schedule actions" {
				t.Errorf("process names %v", names)
			}
			if math.Abs(end-pred.StepSeconds*1e6) > 1e-6*end {
				t.Errorf("the last slice ends at %.3f µs, the predicted step is %.3f µs", end, pred.StepSeconds*1e6)
			}
			comm := 0
			for d := range res.Devices() {
				prog := res.ProgramOf(d)
				track := perTrack[[2]int{2, d}]
				if len(track) != len(prog.Instrs) {
					t.Fatalf("device %d: %d slices for %d instructions", d, len(track), len(prog.Instrs))
				}
				for i, in := range prog.Instrs {
					e := track[i]
					if e.Name != in.Op {
						t.Fatalf("device %d slice %d is %q, instruction %q", d, i, e.Name, in.Op)
					}
					if i > 0 && e.Ts < track[i-1].Ts+track[i-1].Dur-1e-6 {
						t.Fatalf("device %d: slice %d (%s) starts at %.3f before the previous one ends", d, i, e.Name, e.Ts)
					}
					if ir.Collectives[in.Op] || in.Op == "send" || in.Op == "recv" {
						comm++
						if e.Cat != "comm" || e.Args["axis"] == nil {
							t.Fatalf("device %d: %s is %q with args %v", d, in.Op, e.Cat, e.Args)
						}
					}
				}
				actions := perTrack[[2]int{3, d}]
				if res.Schedule == nil {
					if len(actions) != 0 {
						t.Errorf("device %d: %d action slices without a pipeline", d, len(actions))
					}
					continue
				}
				r := pred.Timeline.RankOfDevice[d]
				want := 0
				for _, a := range res.Schedule.Actions[r] {
					if a.Kind <= 2 { // F, B, W
						want++
					}
				}
				if len(actions) != want {
					t.Errorf("device %d: %d action slices, the schedule has %d", d, len(actions), want)
				}
				// Each block's instructions lie inside its action's slice.
				window := map[string]event{}
				for _, a := range actions {
					window[a.Name] = a
				}
				for i, in := range prog.Instrs {
					a, ok := window[in.Block]
					if !ok {
						continue
					}
					e := track[i]
					if e.Ts < a.Ts-1e-6 || e.Ts+e.Dur > a.Ts+a.Dur+1e-6 {
						t.Fatalf("device %d: %s at [%.3f, %.3f] outside %s at [%.3f, %.3f]", d, in.Op, e.Ts, e.Ts+e.Dur, a.Name, a.Ts, a.Ts+a.Dur)
					}
				}
			}
			if comm == 0 {
				t.Error("no collective or transfer in the trace")
			}
		})
	}
}

// TestPredictedTraceMatchesRuntimeFormat: an event of the predicted trace
// has the keys of the runtime's --trace events, and the runtime's
// processes (0, 1) and the prediction's (2, 3) do not collide, so the two
// files' events can be loaded together.
func TestPredictedTraceMatchesRuntimeFormat(t *testing.T) {
	res := compileGPT(t, 1, 1, 1)
	hw, _ := cost.Preset("a100-80g")
	pred, err := hw.Predict(res.Programs, res.Schedule)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	predicted, measured := filepath.Join(dir, "predicted.json"), filepath.Join(dir, "measured.json")
	if err := cost.WriteTrace(predicted, res.Programs, pred); err != nil {
		t.Fatal(err)
	}
	var progs []*lower.Program
	for d := range res.Devices() {
		progs = append(progs, res.ProgramOf(d))
	}
	tr := runtime.NewTracer(progs)
	tr.Hook(0)(0, time.Now(), time.Millisecond)
	if err := tr.WriteFile(measured); err != nil {
		t.Fatal(err)
	}
	_, pe := readTrace(t, predicted)
	_, me := readTrace(t, measured)
	keys := func(evs []map[string]any, ph string) ([]string, []int) {
		var ks []string
		pids := map[int]bool{}
		for _, e := range evs {
			pids[int(e["pid"].(float64))] = true
			if e["ph"] == ph && ks == nil {
				for k := range e {
					ks = append(ks, k)
				}
				sort.Strings(ks)
			}
		}
		var ps []int
		for p := range pids {
			ps = append(ps, p)
		}
		sort.Ints(ps)
		return ks, ps
	}
	pk, pp := keys(pe, "X")
	mk, mp := keys(me, "X")
	if !slices.Equal(pk, mk) {
		t.Errorf("predicted event keys %v, runtime's %v", pk, mk)
	}
	for _, p := range pp {
		if slices.Contains(mp, p) {
			t.Errorf("pid %d in both traces", p)
		}
	}
}
