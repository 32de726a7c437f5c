package tests

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"gcompile/examples/gpt"
	"gcompile/examples/llama"
	"gcompile/frontend"
	"gcompile/generate"
	"gcompile/ir"
	"gcompile/lower"
	"gcompile/runtime"
)

// BenchmarkDecode is generation's speed against the prompt's length: one
// sequence, the prompt prefilled once, then decode steps at positions
// past it, each a token (tokens/s, and ns/op per token). A decode step's
// projections cost the same at every length; only attention reads the
// cache up to the step's position, so the time per token grows slowly
// with the prompt. The models are examples/gpt's and examples/llama's
// defaults (2 layers, h=128, byte vocabulary); GCOMPILE_BENCH_PROMPTS
// overrides the prompt lengths (default 64,256,1024,4096).
// bench/generate/compare.sh runs it beside PyTorch eager.
func BenchmarkDecode(b *testing.B) {
	lens := []int{64, 256, 1024, 4096}
	if s := os.Getenv("GCOMPILE_BENCH_PROMPTS"); s != "" {
		lens = nil
		for _, f := range strings.Split(s, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			require.NoError(b, err)
			lens = append(lens, n)
		}
	}
	const window = 64 // decode positions cycled through past the prompt
	for _, m := range []struct {
		name string
		fn   frontend.ModelFunc
		set  string
	}{
		{"gpt", gpt.Model, "ctx=%d"},
		{"llama", llama.Model, ""},
	} {
		for _, p := range lens {
			b.Run(fmt.Sprintf("%s/prompt=%d", m.name, p), func(b *testing.B) {
				set := m.set
				if strings.Contains(set, "%d") {
					set = fmt.Sprintf(set, p+window)
				}
				_, pre, dec := genCompile(b, m.fn, set, 1, 1, 1, p, p+window, false)
				tokens, positions := make([]int32, p), make([]int32, p)
				for i := range tokens {
					tokens[i], positions[i] = int32(i*7%256), int32(i)
				}
				if p > 1 {
					last := make([]int32, p)
					last[p-1] = 1
					require.NoError(b, pre.SetInt32(ir.InputLastToken, last))
				}
				start := time.Now()
				genStep(b, pre, tokens, positions)
				prefill := time.Since(start)
				require.NoError(b, runtime.CopySources(&dec.MeshCluster, &pre.MeshCluster, generate.Sources(dec.Devices[0].Program(), lower.Buffer.KVCache)))
				tok, pos := []int32{1}, []int32{0}
				b.ResetTimer()
				for i := range b.N {
					pos[0] = int32(p + i%window)
					genStep(b, dec, tok, pos)
				}
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "tokens/s")
				b.ReportMetric(float64(prefill.Milliseconds()), "prefill-ms")
			})
		}
	}
}

// BenchmarkPrefill is one prefill of 4 prompts of 512 tokens through the
// Llama at h=128 with a 32,000-token vocabulary (Llama 2's), its head
// computing the logits of every token (rows=every) or of each prompt's
// last alone (rows=last, what generation compiles): the head's matmul is
// most of a small model's prefill, and its logits most of its memory
// (peak-MiB, the memory plan's figure).
func BenchmarkPrefill(b *testing.B) {
	const batch, prompt = 4, 512
	tokens, positions, last := make([]int32, batch*prompt), make([]int32, batch*prompt), make([]int32, batch*prompt)
	for i := range tokens {
		tokens[i], positions[i] = int32(i*7%32000), int32(i%prompt)
	}
	for s := range batch {
		last[s*prompt+prompt-1] = 1
	}
	for _, every := range []bool{true, false} {
		b.Run(map[bool]string{true: "rows=every", false: "rows=last"}[every], func(b *testing.B) {
			g, pre, _ := genCompile(b, llama.Model, "vocab=32000", 1, 1, batch, prompt, prompt, every)
			if !every {
				require.NoError(b, pre.SetInt32(ir.InputLastToken, last))
			}
			for range b.N {
				genStep(b, pre, tokens, positions)
			}
			b.ReportMetric(float64(g.Prefill.PeakBytes)/(1<<20), "peak-MiB")
		})
	}
}
