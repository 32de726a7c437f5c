package tests

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/examples/gpt"
	"gcompile/examples/llama"
	"gcompile/frontend"
	"gcompile/generate"
	"gcompile/ir"
	"gcompile/lower"
	"gcompile/runtime"
	"gcompile/runtime/checkpoint"
	"gcompile/runtime/cpu"
)

// torchPython is /usr/bin/python3 (Debian's python3-torch) or the first
// python3 that imports torch. The comparison skips without one, and fails
// under GCOMPILE_REQUIRE_LAUNCHERS=1, where CI has installed it.
func torchPython(t testing.TB) string {
	t.Helper()
	var tried []string
	for _, name := range []string{"/usr/bin/python3", "python3"} {
		path, err := exec.LookPath(name)
		if err != nil {
			continue
		}
		if out, err := exec.Command(path, "-c", "import torch").CombinedOutput(); err == nil {
			return path
		} else {
			tried = append(tried, fmt.Sprintf("%s: %s", path, strings.TrimSpace(string(out))))
		}
	}
	msg := fmt.Sprintf("no python3 imports torch (%s)", strings.Join(tried, "; "))
	if os.Getenv("GCOMPILE_REQUIRE_LAUNCHERS") == "1" {
		t.Fatalf("%s, and GCOMPILE_REQUIRE_LAUNCHERS=1", msg)
	}
	t.Skip(msg)
	return ""
}

// torchJob is tests/torchref/kv_reference.py's input; torchResult its output.
type torchJob struct {
	Family    string         `json:"family"`
	Config    map[string]any `json:"config"`
	Weights   string         `json:"weights"`
	Prompts   [][]int32      `json:"prompts"`
	NewTokens int            `json:"new_tokens"`
	DType     string         `json:"dtype"`
	Threads   int            `json:"threads"`
}

type torchResult struct {
	IDs    [][]int32     `json:"ids"`
	Logits [][][]float64 `json:"logits"`
}

func runTorchRef(t testing.TB, python string, job torchJob) torchResult {
	t.Helper()
	in, err := json.Marshal(job)
	require.NoError(t, err)
	cmd := exec.Command(python, filepath.Join("torchref", "kv_reference.py"))
	cmd.Stdin = bytes.NewReader(in)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "kv_reference.py: %s", stderr.String())
	var res torchResult
	require.NoError(t, json.Unmarshal(out, &res))
	return res
}

// saveParams writes every param of c as F32 safetensors, as --save does.
func saveParams(t testing.TB, c *cpu.Cluster, path string) {
	t.Helper()
	var ts []checkpoint.Tensor
	for _, name := range generate.Sources(c.Devices[0].Program(), func(b lower.Buffer) bool { return b.Kind == lower.Param }) {
		id := c.Devices[0].Program().Sources[name]
		x, err := c.Global(name)
		require.NoError(t, err)
		f := make([]float32, len(x))
		for i, v := range x {
			f[i] = float32(v)
		}
		ts = append(ts, checkpoint.Tensor{Name: name, DType: "F32", Shape: []int(c.Devices[0].Program().Buffers[id].Global.Shape), Data: checkpoint.Float32Bytes(f)})
	}
	require.NoError(t, checkpoint.Save(path, ts, nil))
}

// Greedy generation equals an independent implementation: the same
// weights in a float32 PyTorch GPT-2 and Llama written from Hugging Face's
// semantics (tests/torchref/kv_reference.py: past_key_values, positions
// offset by the cache, each prompt on its own; its weights are the
// safetensors file the tp2 programs load) give the same 64 token ids
// after each of 8 prompts of different lengths, on one device and under
// tp2 (the Llama with one k/v head, fewer than tp, each rank holding it
// whole, and with two, split with the query heads), and the logits each
// token was chosen from agree within 1e-4 of the row's largest.
func TestGreedyMatchesPyTorch(t *testing.T) {
	python := torchPython(t)
	const newTokens = 64
	prompts := make([][]int32, 8)
	longest := 0
	for i := range prompts {
		for j := range 3 + i {
			prompts[i] = append(prompts[i], int32((i*31+j*17+5)%256))
		}
		longest = max(longest, len(prompts[i]))
	}
	context := longest + newTokens
	for _, m := range []struct {
		name, family string
		fn           frontend.ModelFunc
		set          string
		config       map[string]any
	}{
		{"gpt", "gpt2", gpt.Model, fmt.Sprintf("layers=2,hidden=32,heads=4,seq=16,ctx=%d", context),
			map[string]any{"layers": 2, "hidden": 32, "heads": 4, "vocab": 256, "ctx": context}},
		{"llama-kv1", "llama", llama.Model, "layers=2,hidden=32,heads=4,kv_heads=1,ffn=48,seq=16,rope_theta=100",
			map[string]any{"layers": 2, "hidden": 32, "heads": 4, "kv_heads": 1, "ffn": 48, "vocab": 256, "rope_theta": 100, "rms_norm_eps": 1e-5}},
		{"llama-kv2", "llama", llama.Model, "layers=2,hidden=32,heads=4,kv_heads=2,ffn=48,seq=16,rope_theta=100",
			map[string]any{"layers": 2, "hidden": 32, "heads": 4, "kv_heads": 2, "ffn": 48, "vocab": 256, "rope_theta": 100, "rms_norm_eps": 1e-5}},
	} {
		t.Run(m.name, func(t *testing.T) {
			var torch torchResult
			w := filepath.Join(t.TempDir(), "w.safetensors")
			for _, tp := range []int{1, 2} {
				t.Run(fmt.Sprintf("tp%d", tp), func(t *testing.T) {
					_, pre, dec := genCompile(t, m.fn, m.set, 1, tp, len(prompts), longest, context, false)
					if tp == 1 {
						saveParams(t, pre, w)
						torch = runTorchRef(t, python, torchJob{Family: m.family, Config: m.config, Weights: w, Prompts: prompts, NewTokens: newTokens, DType: "float32", Threads: 1})
					} else {
						// The Hugging Face-named file torch read, loaded into
						// the tp2 programs.
						ts, _, err := checkpoint.Load(w)
						require.NoError(t, err)
						for _, x := range ts {
							v, err := runtime.Decode(ir.T(ir.F32, x.Shape...), x.Data)
							require.NoError(t, err)
							require.NoError(t, pre.SetGlobal(x.Name, v))
						}
					}
					require.Len(t, torch.IDs, len(prompts))
					e, err := generate.NewMeshEngine(&pre.MeshCluster, &dec.MeshCluster, len(prompts), longest, context)
					require.NoError(t, err)
					logits := make([][][]float64, len(prompts))
					got, err := e.Run(generate.Request{Prompts: prompts, MaxNew: newTokens, Sampling: generate.Sampling{TopP: 1}, EOS: -1,
						OnLogits: func(seq, step int, l []float64) { logits[seq] = append(logits[seq], append([]float64(nil), l...)) }})
					require.NoError(t, err)
					worst := 0.0
					for p := range prompts {
						assert.Equal(t, torch.IDs[p], got[p], "prompt %d's greedy tokens", p)
						for s := range min(len(logits[p]), len(torch.Logits[p])) {
							want, have := torch.Logits[p][s], logits[p][s]
							require.Len(t, have, len(want))
							scale := 0.0
							for _, w := range want {
								scale = math.Max(scale, math.Abs(w))
							}
							for i := range want {
								worst = math.Max(worst, math.Abs(want[i]-have[i])/scale)
							}
						}
					}
					t.Logf("largest logit difference: %.2g of the row's largest logit", worst)
					assert.Less(t, worst, 1e-4)
				})
			}
		})
	}
}
