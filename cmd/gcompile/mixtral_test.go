package main

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/compile"
	"gcompile/passes"
	"gcompile/runtime/checkpoint"
	"gcompile/runtime/cpu"
)

const mixtralModel = "../../examples/mixtral/model.go"

// tinyMixtral is a Mixtral of 2 layers of 4 experts of width 48 on
// hidden 32.
var tinyMixtral = []string{mixtralModel, "--set", "layers=2,hidden=32,heads=4,kv_heads=2,ffn=48,experts=4,seq=16", "--batch", "4",
	"--max-data-mb", "1", "--run", "--eval-batches", "1"}

// headerEntry is one tensor of a safetensors header.
type headerEntry struct {
	DType string `json:"dtype"`
	Shape []int  `json:"shape"`
}

// safetensorsHeader reads the header of a safetensors file as any reader
// does: a little-endian u64 length, then that much JSON.
func safetensorsHeader(t *testing.T, path string) map[string]headerEntry {
	t.Helper()
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Greater(t, len(raw), 8)
	n := binary.LittleEndian.Uint64(raw[:8])
	var h map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(raw[8:8+n], &h))
	out := map[string]headerEntry{}
	for name, v := range h {
		if name == "__metadata__" {
			continue
		}
		var e headerEntry
		require.NoError(t, json.Unmarshal(v, &e))
		out[name] = e
	}
	return out
}

// mixtralCluster compiles tinyMixtral under plan, as the CLI does, with
// its params initialised.
func mixtralCluster(t *testing.T, plan ...string) (*compile.Result, *cpu.Cluster) {
	t.Helper()
	c, err := parseArgs(gir(t, append(slices.Clone(tinyMixtral), plan...)))
	require.NoError(t, err)
	res, err := compile.Compile(&c.Config, passes.Hooks{})
	require.NoError(t, err)
	cl, err := cpu.NewPipelineCluster(res.Programs, cpu.Options{})
	require.NoError(t, err)
	require.NoError(t, cl.InitParams(1))
	return res, cl
}

// The Mixtral exchanges weights in Hugging Face MixtralForCausalLM's
// names and layouts while it holds each layer's experts stacked: --save
// writes one tensor per expert (…experts.E.w1.weight [ffn, hidden], w3
// the same, w2 [hidden, ffn]) and the router's gate [experts, hidden],
// export of the run's checkpoint writes the same file, and --load of
// that file under expert parallelism gives the same params back, bit for
// bit (saving them again writes the same bytes).
func TestMixtralSavesAndLoadsHuggingFaceNames(t *testing.T) {
	dir := t.TempDir()
	saved, ck := filepath.Join(dir, "saved.safetensors"), filepath.Join(dir, "ck")
	require.NoError(t, mainErr(gir(t, append(slices.Clone(tinyMixtral), "--steps", "2", "--devices", "4", "--ep", "2", "--tp", "2",
		"--save", saved, "--checkpoint-dir", ck))))

	h := safetensorsHeader(t, saved)
	for l := range 2 {
		moe := fmt.Sprintf("model.layers.%d.block_sparse_moe", l)
		assert.Equal(t, headerEntry{"F32", []int{4, 32}}, h[moe+".gate.weight"], "the router is [experts, hidden]")
		for e := range 4 {
			for _, w := range []struct {
				name  string
				shape []int
			}{{"w1", []int{48, 32}}, {"w3", []int{48, 32}}, {"w2", []int{32, 48}}} {
				name := fmt.Sprintf("%s.experts.%d.%s.weight", moe, e, w.name)
				assert.Equal(t, headerEntry{"F32", w.shape}, h[name], name)
			}
		}
	}
	for name := range h {
		assert.False(t, strings.Contains(name, "experts.w"), "%s: a stacked param in the file", name)
	}
	// Embedding, head and final norm; per layer 2 norms, 4 projections,
	// the gate and 3 tensors for each of 4 experts.
	assert.Len(t, h, 3+2*(2+4+1+3*4))

	exported := filepath.Join(dir, "exported.safetensors")
	log, err := captureStderr(t, func() error { return mainErr([]string{"export", ck, "--out", exported}) })
	require.NoError(t, err)
	assert.NotContains(t, log, "tokenizer.json", "bytes have no tokenizer to copy")
	want, _, err := checkpoint.Load(saved)
	require.NoError(t, err)
	got, _, err := checkpoint.Load(exported)
	require.NoError(t, err)
	assertSameTensors(t, want, got)

	res, cl := mixtralCluster(t, "--devices", "2", "--ep", "2")
	require.NoError(t, loadWeights(cl, res.Programs, saved, nil, 0))
	again := filepath.Join(dir, "again.safetensors")
	require.NoError(t, saveWeights(cl, res.Programs, again, 2, true, nil, nil))
	got, _, err = checkpoint.Load(again)
	require.NoError(t, err)
	assertSameTensors(t, want, got)
}

func assertSameTensors(t *testing.T, want, got []checkpoint.Tensor) {
	t.Helper()
	require.Equal(t, len(want), len(got))
	for i := range want {
		assert.Equal(t, want[i].Name, got[i].Name)
		assert.Equal(t, want[i].Shape, got[i].Shape, want[i].Name)
		assert.True(t, slices.Equal(want[i].Data, got[i].Data), "%s: the same bytes", want[i].Name)
	}
}

// A file written here, in Hugging Face's layout with a known value in
// every element of every expert, loads into the stacked params with each
// value in its place: expert e's w1[j][i] (row j of [ffn, hidden]) is
// element [e][i][j] of the stacked [experts, hidden, ffn], w2[i][j] of
// [hidden, ffn] element [e][j][i] of [experts, ffn, hidden]. Missing,
// misshapen and surplus expert tensors are refused by name.
func TestMixtralLoadsExpertsIntoTheirPlaces(t *testing.T) {
	const layers, experts, hidden, ffn = 2, 4, 32, 48
	dir := t.TempDir()
	base := filepath.Join(dir, "base.safetensors")
	require.NoError(t, mainErr(gir(t, append(slices.Clone(tinyMixtral), "--steps", "1", "--save", base))))
	ts, _, err := checkpoint.Load(base)
	require.NoError(t, err)

	// value is the element [r][c] of expert e's matrix w of layer l, exact
	// in f32.
	value := func(l, e int, w string, r, c int) float32 {
		kind := strings.Index("w1w3w2", w) / 2
		return float32(1000*l+100*e+10*kind) + float32(r*64+c)/4096
	}
	pieceOf := map[string]func(r, c int) float32{}
	for l := range layers {
		for e := range experts {
			for _, w := range []string{"w1", "w3", "w2"} {
				pieceOf[fmt.Sprintf("model.layers.%d.block_sparse_moe.experts.%d.%s.weight", l, e, w)] = func(r, c int) float32 { return value(l, e, w, r, c) }
			}
		}
	}
	for i, x := range ts {
		f, ok := pieceOf[x.Name]
		if !ok {
			continue
		}
		rows, cols := x.Shape[0], x.Shape[1]
		vals := make([]float32, rows*cols)
		for r := range rows {
			for c := range cols {
				vals[r*cols+c] = f(r, c)
			}
		}
		ts[i].Data = checkpoint.Float32Bytes(vals)
	}
	known := filepath.Join(dir, "known.safetensors")
	require.NoError(t, checkpoint.Save(known, ts, nil))

	res, cl := mixtralCluster(t, "--devices", "2", "--ep", "2")
	require.NoError(t, loadWeights(cl, res.Programs, known, nil, 0))
	for l := range layers {
		stem := fmt.Sprintf("model.layers.%d.block_sparse_moe.experts.", l)
		for _, w := range []string{"w1", "w3", "w2"} {
			got, err := cl.Global(stem + w)
			require.NoError(t, err)
			in, out := hidden, ffn // the stacked [E, in, out]
			if w == "w2" {
				in, out = ffn, hidden
			}
			require.Len(t, got, experts*in*out)
			for e := range experts {
				for i := range in {
					for j := range out {
						// Hugging Face's [out, in]: row j, column i.
						require.Equal(t, float64(value(l, e, w, j, i)), got[(e*in+i)*out+j], "%s%s[%d][%d][%d]", stem, w, e, i, j)
					}
				}
			}
		}
	}

	without := func(name string) []checkpoint.Tensor {
		return slices.DeleteFunc(slices.Clone(ts), func(x checkpoint.Tensor) bool { return x.Name == name })
	}
	reshaped := slices.Clone(ts)
	surplus := slices.Clone(ts)
	for i, x := range ts {
		if x.Name == "model.layers.1.block_sparse_moe.experts.2.w2.weight" {
			reshaped[i].Shape = []int{48, 32}
			extra := x
			extra.Name = "model.layers.1.block_sparse_moe.experts.4.w2.weight"
			surplus = append(surplus, extra)
		}
	}
	for _, c := range []struct {
		name string
		ts   []checkpoint.Tensor
		want string
	}{
		{"missing", without("model.layers.0.block_sparse_moe.experts.3.w3.weight"),
			`no tensor "model.layers.0.block_sparse_moe.experts.3.w3.weight" (piece 3 of the 4 of param "model.layers.0.block_sparse_moe.experts.w3"`},
		{"transposed", reshaped,
			`tensor "model.layers.1.block_sparse_moe.experts.2.w2.weight" is F32[48 32]; as piece 2 of param "model.layers.1.block_sparse_moe.experts.w2" [4 48 32] it must be [32 48]`},
		{"surplus", surplus, `1 tensor(s) are no param of the model: model.layers.1.block_sparse_moe.experts.4.w2.weight`},
	} {
		t.Run(c.name, func(t *testing.T) {
			file := filepath.Join(dir, c.name+".safetensors")
			require.NoError(t, checkpoint.Save(file, c.ts, nil))
			err := loadWeights(cl, res.Programs, file, nil, 0)
			require.Error(t, err)
			assert.ErrorContains(t, err, c.want)
			assert.ErrorContains(t, err, "--load "+file)
		})
	}
}

// A model whose loss adds its balancing loss to the cross-entropy is
// evaluated on the cross-entropy (its lm_loss output), as Megatron-LM's
// validation is and as any other implementation's perplexity counts it:
// the same weights give the same held-out loss with the balancing weight
// at 0, on one device and under a pipeline, and training's last held-out
// loss is that figure. The balancing weight changes the model's
// fingerprint but not its logits, so its checkpoint evaluates with the
// weight at 0 as well, and its weights load without a note.
func TestEvalReportsAnMoEsCrossEntropy(t *testing.T) {
	dir := t.TempDir()
	w, met, ck := filepath.Join(dir, "w.safetensors"), filepath.Join(dir, "m.json"), filepath.Join(dir, "ckpt")
	require.NoError(t, mainErr(append(append([]string{}, tinyMixtral...), "--steps", "3", "--save", w, "--metrics", met, "--checkpoint-dir", ck)))
	m := readMetrics(t, met)
	require.NotEmpty(t, m.Eval)
	last := m.Steps[len(m.Steps)-1].Outputs
	require.Greater(t, last["aux"], 0.5, "the balancing loss is far from 0, so adding it would show")
	eval := func(set string, plan ...string) float64 {
		t.Helper()
		args := []string{"eval", mixtralModel, "--set", set, "--batch", "4", "--max-data-mb", "1", "--eval-batches", "1", "--load", w}
		var out string
		log, err := captureStderr(t, func() error {
			out = captureStdout(t, func() { require.NoError(t, mainErr(append(args, plan...))) })
			return nil
		})
		require.NoError(t, err)
		assert.NotContains(t, log, "note: --load", "weights of the same logits")
		var r evalResult
		require.NoError(t, json.Unmarshal([]byte(out), &r), "%s", out)
		require.NotNil(t, r.Loss)
		return *r.Loss
	}
	shape := tinyMixtral[2]
	ce := eval(shape + ",aux=0")
	assert.InDelta(t, ce, eval(shape), 1e-6, "the balancing loss is not in the held-out figure")
	assert.InDelta(t, ce, eval(shape, "--devices", "2", "--pp", "2", "--microbatches", "2"), 1e-6, "nor under a pipeline's forward-only programs")
	assert.InDelta(t, ce, m.Eval[len(m.Eval)-1].Loss, 1e-6, "training's held-out loss is the same figure")
	out := captureStdout(t, func() {
		require.NoError(t, mainErr([]string{"eval", mixtralModel, "--set", shape + ",aux=0", "--batch", "4", "--max-data-mb", "1", "--eval-batches", "1", "--resume", ck}))
	})
	var r evalResult
	require.NoError(t, json.Unmarshal([]byte(out), &r), "%s", out)
	require.NotNil(t, r.Loss)
	assert.InDelta(t, ce, *r.Loss, 1e-6, "the checkpoint of the run, evaluated without the balancing loss")
	// A setting of the forward is still another model.
	err := mainErr([]string{"eval", mixtralModel, "--set", shape + ",rope_theta=500000", "--batch", "4", "--max-data-mb", "1", "--eval-batches", "1", "--resume", ck})
	require.ErrorIs(t, err, checkpoint.ErrMismatch)
	assert.ErrorContains(t, err, "this model is another")
}
