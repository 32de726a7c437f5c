package tests

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/lower"
)

// Offloading the optimizer state moves it to host memory: training is
// bit-identical and the device's peak drops by exactly the state's bytes
// (the peak is in the backward, when no state is on the device).
func TestOffloadOptimizerState(t *testing.T) {
	ref := train(t, plan{dp: 1})
	got := train(t, plan{dp: 1, offload: "optimizer"})
	assert.Equal(t, ref.losses, got.losses, "bit-identical losses")
	assert.Equal(t, ref.params, got.params, "bit-identical params")
	state := bytesOf(ref.prog, lower.State)
	assert.Positive(t, state)
	assert.Equal(t, ref.prog.PeakBytes-state, got.prog.PeakBytes, "device peak drops by the offloaded bytes")
	assert.Equal(t, int64(0), got.prog.Peak.Optimizer, "no optimizer state on the device at the peak")
	assert.Equal(t, state, got.prog.HostBytes, "the host arena holds exactly the state")
	assert.Equal(t, got.prog.PeakBytes, got.peaks[0], "measured peak equals predicted")
	assert.Less(t, got.prog.ArenaBytes, ref.prog.ArenaBytes)
	t.Logf("device peak %d → %d bytes (state %d bytes on the host)", ref.prog.PeakBytes, got.prog.PeakBytes, state)
}

// bytesOf sums a program's buffers of the given kinds (host or device).
func bytesOf(p *lower.Program, kinds ...lower.BufferKind) int64 {
	var n int64
	for _, b := range p.Buffers {
		for _, k := range kinds {
			if b.Kind == k {
				n += b.Bytes
			}
		}
	}
	return n
}

// hostCopies sums the temporaries a program keeps on the host between
// uses: a param's low-precision copy, a param received from another
// pipeline rank.
func hostCopies(p *lower.Program) int64 {
	var n int64
	for _, b := range p.Buffers {
		if b.Host && !b.Kind.Persistent() {
			n += b.Bytes
		}
	}
	return n
}

// weightVersion reports whether b is a state that holds weights
// (PipeDream-2BW's previous version of a param, initialised as its copy).
func weightVersion(b lower.Buffer) bool {
	return b.Kind == lower.State && strings.HasPrefix(b.Value.Attrs.Str("init"), "copy:")
}

// optimizerState sums a program's optimizer state proper (weight versions
// left out: they go with the params).
func optimizerState(p *lower.Program) int64 {
	var n int64
	for _, b := range p.Buffers {
		if b.Kind == lower.State && !weightVersion(b) {
			n += b.Bytes
		}
	}
	return n
}

// offloaded is what --offload off moves to the host arena of p: the
// params (with weight versions) and the param copies that wait there,
// and/or the optimizer state.
func offloaded(t *testing.T, p *lower.Program, off string) int64 {
	t.Helper()
	optimizer, params, err := lower.ParseOffload(off)
	require.NoError(t, err)
	var n int64
	if params {
		n += bytesOf(p, lower.Param) + hostCopies(p)
		for _, b := range p.Buffers {
			if weightVersion(b) {
				n += b.Bytes
			}
		}
	}
	if optimizer {
		n += optimizerState(p)
	}
	return n
}

// Parameter offload is lossless: every configuration trains bit-identically
// (losses and final params) to the same configuration without it, the host
// arena holds exactly the offloaded bytes, the device's persistent bytes
// drop by exactly those, and each device measures the peak the plan
// predicts.
func TestOffloadParamsTrainsBitIdentically(t *testing.T) {
	for _, p := range []plan{{dp: 1}, {dp: 2, zero: 1}, {tp: 2}, {dp: 2, zero: 3}, {precision: "bf16"}, {micro: 2, recompute: "full"}, {dp: 2, tp: 2, sp: true, recompute: "selective"},
		{model: "llama", dp: 2, tp: 2, sp: true, recompute: "selective"}} {
		ref := train(t, p)
		for _, off := range []string{"params", "optimizer,params"} {
			t.Run(fmt.Sprintf("%v_%s_%s_%s", p, p.precision, p.recompute, off), func(t *testing.T) {
				q := p
				q.offload = off
				got := train(t, q)
				assert.Equal(t, ref.losses, got.losses, "bit-identical losses")
				assert.Equal(t, ref.params, got.params, "bit-identical params")
				assert.Equal(t, ref.eval, got.eval, "bit-identical held-out loss")
				host := offloaded(t, got.prog, off)
				assert.Equal(t, host, got.prog.HostBytes, "the host arena holds exactly the offloaded bytes")
				assert.Equal(t, ref.prog.PersistentBytes-(host-hostCopies(got.prog)), got.prog.PersistentBytes)
				assert.Less(t, got.prog.PeakBytes, ref.prog.PeakBytes)
				assert.Less(t, got.prog.Peak.Params, ref.prog.Peak.Params, "only the params in a use window are on the device at the peak")
				for r, peak := range got.peaks {
					assert.Equal(t, got.prog.PeakBytes, peak, "device %d: measured peak equals predicted", r)
				}
				t.Logf("peak %d → %d bytes (params at the peak %d → %d), host %d bytes", ref.prog.PeakBytes, got.prog.PeakBytes, ref.prog.Peak.Params, got.prog.Peak.Params, got.prog.HostBytes)
			})
		}
	}
}

// trainPipelineWith is trainPipeline with lowering options.
func trainPipelineWith(t *testing.T, pl pipePlan, layers int, o lower.Options) pipelineRun {
	t.Helper()
	m, progs, evals := compilePipeline(t, pl, layers, pipeSetup{lower: o})
	return runPipeline(t, m, progs, evals)
}

// Under pipeline parallelism each rank's program offloads its own state
// and params: training is bit-identical, and with the optimizer offloaded
// each rank's device peak drops by exactly its stage's state bytes. Under
// PipeDream-2BW the previous weight versions, which forward and backward
// read, go with the params.
func TestOffloadUnderPipelineParallelism(t *testing.T) {
	const layers = 4
	for _, pl := range []pipePlan{{pp: 2, micro: 4, name: "1f1b"}, {pp: 2, micro: 4, name: "zb"}, {pp: 2, tp: 2, micro: 2, name: "1f1b"}, {pp: 2, micro: 4, name: "2bw"}} {
		pl.order = scheduleOrder(pl.name)
		ref := trainPipelineWith(t, pl, layers, lower.Options{})
		for _, off := range []string{"optimizer", "params", "optimizer,params"} {
			t.Run(pl.String()+"_"+off, func(t *testing.T) {
				got := trainPipelineWith(t, pl, layers, lower.Options{Offload: off})
				assert.Equal(t, ref.losses, got.losses, "bit-identical losses")
				assert.Equal(t, ref.params, got.params, "bit-identical params")
				assert.Equal(t, ref.eval, got.eval, "bit-identical held-out loss")
				for r, p := range got.progs {
					before := ref.progs[r]
					host := offloaded(t, p, off)
					assert.Equal(t, host, p.HostBytes, "rank %d: the host arena holds exactly the offloaded bytes", r)
					assert.Less(t, p.PeakBytes, before.PeakBytes, "rank %d", r)
					if off != "optimizer" && r == len(got.progs)-1 {
						// The last stage receives the tied embedding each
						// step; between uses it waits on the host.
						assert.Equal(t, tiedBytes(t, ref.progs[0]), hostCopies(p), "rank %d: the received embedding is offloaded", r)
					}
					if off == "optimizer" {
						state := optimizerState(before)
						assert.Positive(t, state)
						assert.Equal(t, before.PeakBytes-state, p.PeakBytes, "rank %d: the peak drops by exactly the stage's state bytes", r)
						assert.Zero(t, p.Peak.Optimizer, "rank %d: no state on the device at the peak", r)
					}
					t.Logf("rank %d: peak %d → %d bytes, host %d bytes", r, before.PeakBytes, p.PeakBytes, p.HostBytes)
				}
			})
		}
	}
}

// tiedBytes is the size of the first stage's share of the tied embedding.
func tiedBytes(t *testing.T, first *lower.Program) int64 {
	t.Helper()
	id, ok := first.Sources["wte.weight"]
	require.True(t, ok, "the first stage owns the embedding")
	return first.Buffers[id].Bytes
}
