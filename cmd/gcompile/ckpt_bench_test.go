package main

import (
	"path/filepath"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"gcompile/compile"
	"gcompile/lower"
	"gcompile/passes"
	"gcompile/runtime"
	"gcompile/runtime/checkpoint"
	"gcompile/runtime/cpu"
)

// BenchmarkCheckpoint saves and loads the whole training state of a
// GPT-2-small-shaped model (12 layers, hidden 768, byte vocabulary: 85M
// params, 1.02 GB of params and Adam moments) on one device and on four
// (dp2·tp2, ZeRO-1), through the file system with fsync. MB/s is the
// state's bytes over the time.
//
//	go test ./cmd/gcompile -run '^$' -bench Checkpoint -benchtime 3x
func BenchmarkCheckpoint(b *testing.B) {
	for _, plan := range [][]string{nil, {"--devices", "4", "--dp", "2", "--tp", "2", "--zero", "1"}} {
		c, err := parseArgs(append([]string{gptModel, "--set", "layers=12,hidden=768,heads=12,seq=16", "--batch", "2", "--run"}, plan...))
		require.NoError(b, err)
		res, err := compile.Compile(&c.Config, passes.Hooks{})
		require.NoError(b, err)
		cl, err := cpu.NewPipelineCluster(res.Programs, cpu.Options{})
		require.NoError(b, err)
		require.NoError(b, cl.InitParams(1))
		// The state's bytes, each tensor once however it is split or
		// replicated.
		var state int64
		seen := map[string]bool{}
		for _, p := range res.Programs {
			for _, buf := range p.Buffers {
				if (buf.Kind == lower.Param || buf.Kind == lower.State) && !seen[buf.Name] {
					seen[buf.Name] = true
					state += buf.Global.Bytes()
				}
			}
		}
		if len(plan) == 0 {
			require.Greater(b, state, int64(1e9), "at least 1 GB of state")
		}
		name := "one device"
		if plan != nil {
			name = "dp2 tp2 ZeRO-1"
		}
		root := b.TempDir()
		var saved string
		b.Run("save/"+name, func(b *testing.B) {
			b.SetBytes(state)
			step := 0
			for b.Loop() {
				step++
				saved, err = checkpoint.SaveState(cl, res.Programs, checkpoint.SaveOptions{Root: root, State: runtime.State{Step: step}, KeepLast: 1})
				require.NoError(b, err)
			}
		})
		b.Run("load/"+name, func(b *testing.B) {
			b.SetBytes(state)
			for b.Loop() {
				_, err := checkpoint.RestoreState(cl, res.Programs, saved, checkpoint.Expect{})
				require.NoError(b, err)
			}
		})
	}
}

// BenchmarkDemoCheckpointEvery10 is the cost of --checkpoint-every 10 on
// the demo's model and batch (20 steps, two saves): the time the saves
// took as a share of the steps' time, and per save.
func BenchmarkDemoCheckpointEvery10(b *testing.B) {
	var overhead, perSave float64
	for b.Loop() {
		dir := b.TempDir()
		args := []string{gptModel, "--run", "--steps", "20", "--batch", "16", "--eval-batches", "1", "--metrics", filepath.Join(dir, "m.json"),
			"--checkpoint-dir", filepath.Join(dir, "ck"), "--checkpoint-every", "10"}
		require.NoError(b, mainErr(slices.Clone(args)))
		m := readMetrics(b, filepath.Join(dir, "m.json"))
		var steps, saves float64
		for _, s := range m.Steps {
			steps += s.Ms
		}
		for _, s := range m.Checkpoints {
			saves += s.Ms
		}
		require.Len(b, m.Checkpoints, 2)
		overhead, perSave = 100*saves/steps, saves/2
	}
	b.ReportMetric(overhead, "%overhead")
	b.ReportMetric(perSave, "ms/save")
}
