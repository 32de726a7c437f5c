package cost

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// llama3_8B is Llama 3 8B at a context of seq tokens.
func llama3_8B(seq int) Transformer {
	return Transformer{Layers: 32, Hidden: 4096, Heads: 32, KVHeads: 8, FFN: 14336, Vocab: 128256, Seq: seq, GatedMLP: true, FusedAttention: true}
}

// Ring attention's transfers run beside its compute (their own stream on
// a GPU): on H100s at 131072 tokens, tp8·cp8, a chunk of 16384 tokens
// takes far longer to attend than its K/V take to cross NVLink, so the
// ring hides all of its traffic and cp costs the step only the
// gradients' reduction; the traffic is still counted, (cp−1)·10 chunks a
// layer and microbatch and two gradients home. Across nodes with a slow
// network, at a short chunk, the transfers show.
func TestRingOverlapPriced(t *testing.T) {
	h100, err := Preset("h100-sxm")
	require.NoError(t, err)
	m := llama3_8B(131072)
	p := Plan{TP: 8, PP: 1, DP: 1, CP: 8, MicroBatch: 1, Microbatches: 1, Precision: "bf16", Recompute: "none", Optimizer: "adamw"}
	e, err := h100.EstimateFast(m, p)
	require.NoError(t, err)
	// One K chunk on a device: 16384 tokens × the 8 k/v heads' 1024
	// width split over tp8, in bf16.
	chunk := 2.0 * 16384 * 1024 / 8
	grads := 4 * (32*m.layerParamsPerDevice(8) + m.outerParamsPerDevice(8))
	assert.InDelta(t, 32*((8-1)*10*chunk+2*chunk)+2*grads*(8-1)/8, e.CommBytes["cp"], 1,
		"bytes on cp: the ring's chunks and the gradients' all-reduce")
	link := h100.axisLink(8, 8, 64)
	buckets := float64(int((grads + defaultBucketBytes - 1) / defaultBucketBytes))
	reduce := buckets * Collective("all_reduce", 8, grads/buckets, link)
	// Only the two gradients' steps home are not hidden.
	home := 32 * 2 * P2P(chunk, link)
	assert.InDelta(t, reduce+home, e.CommSeconds["cp"], 1e-9, "time on cp: the gradients' reduction and the ring's last steps; the chunks hide behind attention")

	slow := *h100
	slow.DevicesPerNode = 1
	slow.InterGBps /= 100
	short := llama3_8B(8192)
	e2, err := slow.EstimateFast(short, p)
	require.NoError(t, err)
	e3, err := h100.EstimateFast(short, p)
	require.NoError(t, err)
	assert.Greater(t, e2.CommSeconds["cp"], e3.CommSeconds["cp"], "a slow link between cp ranks shows")
	t.Logf("128K, tp8·cp8 on h100-sxm: step %.0f ms, cp %.1f ms (the gradients' reduction and the ring's last steps home); 8K across slow nodes: cp %.1f ms vs %.1f ms on one node",
		e.StepSeconds*1e3, reduce*1e3, e2.CommSeconds["cp"]*1e3, e3.CommSeconds["cp"]*1e3)
}
