package tests

import (
	"math/rand/v2"
	"os"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"gcompile/examples/gpt"
	"gcompile/frontend"
	"gcompile/lower"
	"gcompile/passes"
	"gcompile/runtime/cuda"
)

// BenchmarkCUDAGPTStep times one training step (forward, backward, AdamW)
// of the reference GPT on the GPU through the CUDA backend, one virtual
// device. The model is $GCOMPILE_GPT (default a 1.3B GPT at seq 2048:
// layers=24,hidden=2048,heads=16,seq=2048,vocab=51200), the batch
// $GCOMPILE_GPT_BATCH (default 4), the precision $GCOMPILE_GPT_PRECISION
// (default bf16). It reports ms/step, tokens/s and model FLOPs
// utilisation against $GCOMPILE_PEAK_TFLOPS (default 989, H100 SXM bf16
// dense), with the FLOPs of Narayanan et al. (2021) without recompute,
// 72·B·s·l·h²·(1 + s/(6h) + V/(12·l·h)) — the same count
// bench/torch_gpt.py uses for PyTorch eager on the same model.
func BenchmarkCUDAGPTStep(b *testing.B) {
	if os.Getenv("GCOMPILE_GPU_TESTS") != "1" {
		b.Skip("needs an NVIDIA GPU and its libraries: set GCOMPILE_GPU_TESTS=1")
	}
	set := envOr("GCOMPILE_GPT", "layers=24,hidden=2048,heads=16,seq=2048,vocab=51200")
	batch, err := strconv.Atoi(envOr("GCOMPILE_GPT_BATCH", "4"))
	require.NoError(b, err)
	peak, err := strconv.ParseFloat(envOr("GCOMPILE_PEAK_TFLOPS", "989"), 64)
	require.NoError(b, err)
	settings, err := frontend.ParseSet(set)
	require.NoError(b, err)
	m, err := frontend.Build(gpt.Model, frontend.Config{Name: "gpt", Batch: batch, Set: settings})
	require.NoError(b, err)
	opts := passes.DefaultOptions()
	opts.Precision = envOr("GCOMPILE_GPT_PRECISION", "bf16")
	_, err = passes.Run(m, opts, passes.Hooks{})
	require.NoError(b, err)
	prog, err := lower.Lower(m)
	require.NoError(b, err)
	rt, err := cuda.Open(cuda.Config{CacheDir: os.Getenv("GCOMPILE_CACHE")})
	require.NoError(b, err)
	defer rt.Close()
	cl, err := cuda.NewCluster(rt, prog, cuda.Options{})
	require.NoError(b, err)
	defer cl.Close()
	require.NoError(b, cl.InitParams(1))

	tok := prog.Buffers[prog.Sources["tokens"]].Global
	bsz, seq := tok.Shape[0], tok.Shape[1]
	l, h := atoi(b, settings["layers"]), atoi(b, settings["hidden"])
	v := atoi(b, settings["vocab"])
	fb, fs, fl, fh, fv := float64(bsz), float64(seq), float64(l), float64(h), float64(v)
	flops := 72 * fb * fs * fl * fh * fh * (1 + fs/(6*fh) + fv/(12*fl*fh))
	rng := rand.New(rand.NewPCG(2, 3))
	ids := func() []int32 {
		out := make([]int32, bsz*seq)
		for i := range out {
			out[i] = int32(rng.IntN(v))
		}
		return out
	}
	require.NoError(b, cl.SetInt32("tokens", ids()))
	require.NoError(b, cl.SetInt32("targets", ids()))
	require.NoError(b, cl.SetScalar("lr", 1e-4))
	if opts.Precision != "fp32" {
		require.NoError(b, cl.SetScalar("loss_scale", 1))
	}
	step := 0
	run := func() {
		step++
		if err := cl.SetScalar("step", float64(step)); err != nil {
			b.Fatal(err)
		}
		if err := cl.Step(); err != nil {
			b.Fatal(err)
		}
	}
	for range 2 { // NVRTC, cuBLASLt heuristics and first touches stay out of the timing
		run()
	}
	first, err := cl.Scalar("loss")
	require.NoError(b, err)
	b.ResetTimer()
	for range b.N {
		run()
	}
	loss, err := cl.Scalar("loss") // reading the loss waits for the last step
	require.NoError(b, err)
	b.StopTimer()
	per := b.Elapsed().Seconds() / float64(b.N)
	b.ReportMetric(per*1e3, "ms/step")
	b.ReportMetric(fb*fs/per, "tokens/s")
	b.ReportMetric(flops/per/(peak*1e12), "MFU")
	b.ReportMetric(float64(prog.PeakBytes)/(1<<30), "peak-GiB")
	b.Logf("%s on %s: batch %d × seq %d, %s, loss %.4f → %.4f", set, cl.Name(), bsz, seq, opts.Precision, first, loss)
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func atoi(tb testing.TB, s string) int {
	n, err := strconv.Atoi(s)
	require.NoError(tb, err)
	return n
}
