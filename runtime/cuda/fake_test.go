package cuda

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/data"
	"gcompile/ir"
	"gcompile/lower"
	"gcompile/passes"
	"gcompile/runtime"
	rcomm "gcompile/runtime/comm"
	"gcompile/runtime/cpu"
	"gcompile/runtime/cuda/driver"
	"gcompile/runtime/cuda/fakegpu"
)

// GPUTestsEnv runs this package's tests on the machine's GPU instead of
// the fake one.
const GPUTestsEnv = "GCOMPILE_GPU_TESTS"

// emulatorLaunch keeps the emulator's thread count low: it runs every
// thread of a block on an OS thread and a block's barriers dominate.
var emulatorLaunch = Launch{Threads: 32, Blocks: 4}

// onGPU reports whether the tests run on a real GPU.
func onGPU() bool { return os.Getenv(GPUTestsEnv) == "1" }

// openTest opens a Runtime on the real GPU when GCOMPILE_GPU_TESTS=1,
// else on the fake GPU (kernels in the emulator, naive GEMMs), whose
// numbers are real but whose timings say nothing about a GPU.
func openTest(t *testing.T) *Runtime {
	t.Helper()
	cfg := Config{CacheDir: t.TempDir()}
	if !onGPU() {
		fakegpu.Install(t)
		cfg.Launch = emulatorLaunch
	}
	rt, err := Open(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, rt.Close()) })
	return rt
}

// tol is a tolerance measured on the fake GPU, or the looser one a real
// GPU needs (CUDA's math library, cuBLASLt's summation order).
func tol(fake, gpu float64) float64 {
	if onGPU() {
		return gpu
	}
	return fake
}

// slow skips a test that trains the GPT in the emulator under -short.
func slow(t *testing.T) {
	if testing.Short() && !onGPU() {
		t.Skip("runs GPT steps in the kernel emulator (tens of seconds); skipped with -short")
	}
}

// testCorpus is deterministic text with structure a model can learn.
func testCorpus() *data.Corpus {
	var b strings.Builder
	for i := 0; b.Len() < 1<<16; i++ {
		fmt.Fprintf(&b, "func f%d(x int) int { return x*%d + %d }\n", i, i%7, i%13)
	}
	text := []byte(b.String())
	cut := len(text) * 9 / 10
	return &data.Corpus{Source: "synthetic", Train: text[:cut], Eval: text[cut:]}
}

// trainer is what both backends' clusters offer the comparisons.
type trainer interface {
	runtime.Device
	InitParams(seed uint64) error
	Global(name string) ([]float64, error)
	SetEvalPrograms(progs []*lower.Program) error
}

type run struct {
	losses []float64
	eval   float64
	params map[string][]float64
}

func trainOn(t *testing.T, cl trainer, progs []*lower.Program, steps, batch int) run {
	t.Helper()
	require.NoError(t, cl.InitParams(1))
	cfg := runtime.TrainConfig{Steps: steps, Batch: batch, Seq: testSeq, Seed: 3, EvalBatches: 1,
		Schedule: runtime.Schedule{LR: 3e-3, MinLR: 3e-4, Warmup: 5, Steps: 20, Decay: "cosine"}}
	if _, mixed := progs[0].Sources["loss_scale"]; mixed {
		cfg.LossScale = runtime.NewLossScaler(1024) // static, as --loss-scale 1024
	}
	ms, evals, err := runtime.Train(cl, testCorpus(), cfg, nil)
	require.NoError(t, err)
	r := run{params: map[string][]float64{}, eval: evals[len(evals)-1].Loss}
	for _, s := range ms {
		r.losses = append(r.losses, s.Loss)
	}
	for _, p := range progs {
		for _, b := range p.Buffers {
			if b.Kind == lower.Param {
				r.params[b.Name], err = cl.Global(b.Name)
				require.NoError(t, err)
			}
		}
	}
	return r
}

// isKeyBias reports whether element i of param name is a key bias (the
// middle third of a fused c_attn.bias): softmax ignores a per-row shift,
// so its gradient is exactly 0 up to rounding noise, which Adam
// normalises into steps of about ±lr whatever its size. No two runs that
// round differently agree on those entries (tests/precision_test.go
// leaves them out too).
func isKeyBias(name string, i int) bool {
	h := 32 // testModel's hidden
	return strings.HasSuffix(name, "attn.c_attn.bias") && i >= h && i < 2*h
}

func relDiff(a, b float64) float64 { return math.Abs(a-b) / math.Abs(b) }

// compareWithCPU trains c for steps on both backends and returns the worst
// relative loss difference (steps and the held-out loss) and the worst
// parameter difference relative to each tensor's largest entry (key
// biases aside).
func compareWithCPU(t *testing.T, rt *Runtime, c config, steps int) (loss, param float64, cl *Cluster) {
	t.Helper()
	progs := programs(t, c)
	ref, err := cpu.NewPipelineCluster(progs, cpu.Options{})
	require.NoError(t, err)
	cl, err = NewPipelineCluster(rt, progs, Options{})
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, cl.Close()) })
	if c.pp > 1 {
		require.NoError(t, ref.SetEvalPrograms(evalPrograms(t, c)))
		require.NoError(t, cl.SetEvalPrograms(evalPrograms(t, c)))
	}
	batch := testBatch
	if c.batch > 0 {
		batch = c.batch
	}
	want := trainOn(t, ref, progs, steps, batch)
	got := trainOn(t, cl, progs, steps, batch)
	for i := range want.losses {
		loss = max(loss, relDiff(got.losses[i], want.losses[i]))
	}
	loss = max(loss, relDiff(got.eval, want.eval))
	for name, w := range want.params {
		scale := 0.0
		for _, v := range w {
			scale = max(scale, math.Abs(v))
		}
		for i := range w {
			if !isKeyBias(name, i) {
				param = max(param, math.Abs(got.params[name][i]-w[i])/scale)
			}
		}
	}
	return loss, param, cl
}

// Initial weights and optimizer state are the CPU backend's to the bit:
// both take them from cpu.InitialBytes, whole tensors drawn from the seed
// and the param's name, each device keeping its block.
func TestInitParamsSameBitsAsCPU(t *testing.T) {
	rt := openTest(t)
	for _, c := range []config{{name: "fp32"}, {name: "tp2", mesh: tp2}, {name: "dp2_zero1", mesh: dp2, edit: func(o *passes.Options) { o.Zero = 1 }}} {
		t.Run(c.name, func(t *testing.T) {
			progs := programs(t, c)
			ref, err := cpu.NewPipelineCluster(progs, cpu.Options{})
			require.NoError(t, err)
			cl, err := NewPipelineCluster(rt, progs, Options{})
			require.NoError(t, err)
			defer func() { assert.NoError(t, cl.Close()) }()
			require.NoError(t, ref.InitParams(7))
			require.NoError(t, cl.InitParams(7))
			checked := 0
			for r, d := range cl.Devices {
				for _, b := range d.Program().Buffers {
					if b.Kind != lower.Param && b.Kind != lower.State {
						continue
					}
					want, _, err := ref.Devices[r].Bytes(b.Name)
					require.NoError(t, err)
					got, _, err := d.Bytes(b.Name)
					require.NoError(t, err)
					require.True(t, bytes.Equal(want, got), "device %d: %s differs from the CPU's", r, b.Name)
					checked++
				}
			}
			assert.Greater(t, checked, 20)
		})
	}
}

// Sequence parallelism moves activations split on the sequence dim:
// reduce-scatters and all-gathers whose pieces are not contiguous, cut and
// joined by the slice and concat kernels. One step and an evaluation
// match the CPU backend, and each device's measured peak is the plan's.
func TestSequenceParallelStep(t *testing.T) {
	slow(t)
	rt := openTest(t)
	loss, param, cl := compareWithCPU(t, rt, config{name: "tp2_sp", mesh: tp2, set: tiny.set, batch: tiny.batch, edit: func(o *passes.Options) { o.SequenceParallel = true }}, 1)
	// Measured on the fake GPU: losses identical, weights within 1.4e-6.
	t.Logf("tp2 sequence parallel, 1 step: worst loss difference %.3g, worst param difference %.3g", loss, param)
	assert.LessOrEqual(t, loss, tol(1e-6, 1e-4))
	assert.LessOrEqual(t, param, tol(2e-5, 1e-3))
	seen := map[string]bool{}
	for _, d := range cl.Devices {
		for _, in := range d.Program().Instrs {
			seen[in.Op] = true
		}
		assert.Equal(t, d.Program().PeakBytes, d.PeakBytes(), "device %d: measured peak equals predicted", d.Rank())
	}
	assert.True(t, seen["reduce_scatter"] && seen["all_gather"], "the program must move sequence shards")
}

// Offloaded params and optimizer state live in pinned host memory and
// are fetched on the copy stream ahead of their use: training matches
// the CPU backend's offloaded run, and the device's measured peak is the
// plan's (the staged copies count from their fetch).
func TestOffloadStep(t *testing.T) {
	slow(t)
	rt := openTest(t)
	c := config{name: "offload", set: tiny.set, batch: tiny.batch, lower: lower.Options{Offload: "optimizer,params"}}
	loss, param, cl := compareWithCPU(t, rt, c, 1)
	// Measured on the fake GPU: losses identical, weights within 1.8e-6.
	t.Logf("offload optimizer,params, 1 step: worst loss difference %.3g, worst param difference %.3g", loss, param)
	assert.LessOrEqual(t, loss, tol(1e-6, 1e-4))
	assert.LessOrEqual(t, param, tol(2e-5, 1e-3))
	d := cl.Devices[0]
	assert.Positive(t, d.Program().HostBytes)
	assert.NotEmpty(t, d.fetches, "host-to-device copies run on the copy stream")
	assert.Equal(t, d.Program().PeakBytes, d.PeakBytes())
}

// tiny is a one-layer GPT on a small batch, for the tests that need a
// step but not the comparison.
var tiny = config{name: "tiny", set: map[string]string{"layers": "1"}, batch: 2}

// A token id outside the vocabulary cannot fail inside a kernel: the
// embedding sets its status word, and the step reports the instruction
// and the id, read back from the input.
func TestBadTokenIsNamed(t *testing.T) {
	rt := openTest(t)
	progs := programs(t, tiny)
	d, err := Load(rt, progs[0], Options{})
	require.NoError(t, err)
	defer func() { assert.NoError(t, d.Close()) }()
	require.NoError(t, d.InitParams(1))
	tokens := make([]int32, 2*testSeq)
	tokens[5] = 300
	require.NoError(t, d.SetInt32("tokens", tokens))
	require.NoError(t, d.SetInt32("targets", make([]int32, 2*testSeq)))
	require.NoError(t, d.SetScalar("lr", 1e-3))
	require.NoError(t, d.SetScalar("step", 1))
	err = d.Step()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "embedding")
	assert.Contains(t, err.Error(), "token id 300 at position 5 is outside [0, 256)")

	// A step number below 1 is refused as on the CPU, though the kernel
	// could not tell.
	tokens[5] = 0
	require.NoError(t, d.SetInt32("tokens", tokens))
	require.NoError(t, d.SetScalar("step", 0))
	assert.ErrorContains(t, d.Step(), "adamw: step must be ≥ 1, got 0")
}

// With a hook set, every instruction of the step is timed with events on
// the compute stream, in program order; the trace and the schedule
// profile read these. The workspace beside the arena is reported.
func TestTraceTimesEveryInstruction(t *testing.T) {
	rt := openTest(t)
	progs := programs(t, tiny)
	d, err := Load(rt, progs[0], Options{})
	require.NoError(t, err)
	defer func() { assert.NoError(t, d.Close()) }()
	require.NoError(t, d.InitParams(1))
	require.NoError(t, d.SetInt32("tokens", make([]int32, 2*testSeq)))
	require.NoError(t, d.SetInt32("targets", make([]int32, 2*testSeq)))
	require.NoError(t, d.SetScalar("lr", 1e-3))
	require.NoError(t, d.SetScalar("step", 1))
	var seen []int
	var last time.Time
	d.OnInstr = func(i int, start time.Time, dur time.Duration) {
		seen = append(seen, i)
		assert.GreaterOrEqual(t, dur, time.Duration(0))
		assert.False(t, start.Before(last), "instruction %d starts before the one before it", i)
		last = start
	}
	require.NoError(t, d.Step())
	require.Len(t, seen, len(progs[0].Instrs))
	for i, s := range seen {
		require.Equal(t, i, s)
	}
	loss, err := d.Scalar("loss")
	require.NoError(t, err)
	ref, err := cpu.Load(progs[0], cpu.Options{})
	require.NoError(t, err)
	require.NoError(t, ref.InitParams(1))
	require.NoError(t, ref.SetInt32("tokens", make([]int32, 2*testSeq)))
	require.NoError(t, ref.SetInt32("targets", make([]int32, 2*testSeq)))
	require.NoError(t, ref.SetScalar("lr", 1e-3))
	require.NoError(t, ref.SetScalar("step", 1))
	require.NoError(t, ref.Step())
	want, err := ref.Scalar("loss")
	require.NoError(t, err)
	assert.LessOrEqual(t, relDiff(loss, want), tol(1e-6, 1e-5), "loss %v, the CPU's %v", loss, want)
	assert.Equal(t, progs[0].PeakBytes, d.PeakBytes())
	ws := d.Workspace()
	assert.Positive(t, ws.Scratch)
	assert.Positive(t, ws.Keep, "status words of the id-checking kernels")
	assert.Equal(t, ws.Scratch+ws.Keep+ws.GEMM, ws.Total())
}

// meshProgram is a program with no instructions on a mesh of n devices,
// which gives each device an arena for the collectives tests.
func meshProgram(n int, arena int64) *lower.Program {
	return &lower.Program{Name: "collectives", Mesh: &ir.Mesh{Axes: []ir.MeshAxis{{Name: "dp", Size: n}}},
		ArenaBytes: arena, Outputs: map[string]int{}, Sources: map[string]int{}}
}

func f32s(x []float32) []byte {
	b := make([]byte, 4*len(x))
	for i, v := range x {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
	}
	return b
}

func fromBytes(b []byte) []float32 {
	x := make([]float32, len(b)/4)
	for i := range x {
		x[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return x
}

// The virtual devices' collectives add in group-position order, so a sum
// whose value depends on the order ((1e8 + 1) − 1e8 is 0 in float32, not
// 1) comes out as the CPU Comm's, bit for bit, on every member; gathers,
// reduce-scatters and all-to-alls move the right chunks.
func TestFabricCollectives(t *testing.T) {
	rt := openTest(t)
	const n, k = 3, 4 // devices, elements per chunk
	cl, err := newCluster([]*Runtime{rt, rt, rt}, []int{0, 1, 2}, []*lower.Program{meshProgram(n, 1<<12)}, Options{}, newFabric(), nil, nil)
	require.NoError(t, err)
	defer func() { assert.NoError(t, cl.Close()) }()
	fab := cl.comm.(*fabric)
	input := func(r int) []float32 {
		x := make([]float32, n*k)
		for i := range x {
			x[i] = []float32{1e8, 1, -1e8}[r] * float32(1+i%2) / float32(1+r*(i%3))
		}
		return x
	}
	// The CPU Comm's results, the reference.
	cpuComm := rcomm.NewLocal(n)
	want := make([][]float32, n)
	wantRS := make([][]float32, n)
	errs := make(chan error, n)
	for r := range n {
		go func() {
			want[r] = input(r)
			wantRS[r] = make([]float32, k)
			g := runtime.Group{Ranks: []int{0, 1, 2}}
			err := rcomm.AllReduce(cpuComm, g, r, want[r])
			if err == nil {
				err = rcomm.ReduceScatter(cpuComm, g, r, input(r), wantRS[r])
			}
			errs <- err
		}()
	}
	for range n {
		require.NoError(t, <-errs)
	}
	results := make([]map[string][]float32, n)
	err = cl.Each(func(d *Device) error {
		return d.hostIO(func() error {
			drv := rt.drv
			base := d.mem.arena
			at := func(i int) driver.DevicePtr { return base.Add(uint64(i * 4 * n * k)) } // slots of n·k floats
			if err := drv.MemcpyHtoD(at(0), f32s(input(d.rank))); err != nil {
				return err
			}
			g := newGroup([]int{0, 1, 2}, d.rank)
			site, err := fab.site(d)
			if err != nil {
				return err
			}
			tmp := at(5)
			// all-reduce in place of a copy, reduce-scatter, all-gather of
			// chunk 0, all-to-all.
			if err := drv.MemcpyDtoDAsync(at(1), at(0), 4*n*k, d.compute); err != nil {
				return err
			}
			if err := fab.allReduce(d, g, site, []driver.DevicePtr{at(1)}, []int64{n * k}, tmp); err != nil {
				return err
			}
			if err := fab.reduceScatter(d, g, site, d.compute, ir.F32, at(0), at(2), k); err != nil {
				return err
			}
			if err := fab.allGather(d, g, site, at(0), at(3), 4*k); err != nil {
				return err
			}
			if err := fab.allToAll(d, g, site, at(0), at(4), 4*k); err != nil {
				return err
			}
			if err := drv.StreamSynchronize(d.compute); err != nil {
				return err
			}
			out := map[string][]float32{}
			for i, name := range []string{"input", "all_reduce", "reduce_scatter", "all_gather", "all_to_all"} {
				raw := make([]byte, 4*n*k)
				if err := drv.MemcpyDtoH(raw, at(i)); err != nil {
					return err
				}
				out[name] = fromBytes(raw)
			}
			results[d.rank] = out
			return nil
		})
	})
	require.NoError(t, err)
	for r := range n {
		got := results[r]
		assert.Equal(t, want[r], got["all_reduce"], "device %d: all_reduce equals the CPU Comm's, bit for bit", r)
		assert.Equal(t, wantRS[r], got["reduce_scatter"][:k], "device %d: reduce_scatter", r)
		for q := range n {
			assert.Equal(t, input(q)[:k], got["all_gather"][q*k:(q+1)*k], "device %d: all_gather chunk %d", r, q)
			assert.Equal(t, input(q)[r*k:(r+1)*k], got["all_to_all"][q*k:(q+1)*k], "device %d: all_to_all chunk %d", r, q)
		}
	}
	// The order matters for these inputs: adding position 2 before
	// position 1 would give 1.
	x := input(0)[0] + input(2)[0]
	x += input(1)[0]
	assert.Equal(t, float32(1), x)
	assert.Equal(t, float32(0), results[0]["all_reduce"][0])
}

// The other optimizers and fp16 (with its overflow check and gated
// updates) train a small GPT like the CPU backend: their kernels follow
// the CPU's update rules, argument orders included. Measured on the fake
// GPU over 3 steps: sgd and adafactor losses identical, sm3 within 9e-8,
// weights within 7e-7; fp16 losses within 8.3e-6 and weights within 0.019
// (fp16 rounding of last-bit kernel differences, amplified by Adam).
func TestOptimizersAndFP16(t *testing.T) {
	rt := openTest(t)
	for _, c := range []struct {
		config
		loss, param float64 // measured on the fake GPU, with margin
	}{
		{config{name: "sgd", edit: func(o *passes.Options) { o.Optimizer = "sgd" }}, 1e-6, 2e-5},
		{config{name: "adafactor", edit: func(o *passes.Options) { o.Optimizer = "adafactor" }}, 1e-6, 2e-5},
		{config{name: "sm3", edit: func(o *passes.Options) { o.Optimizer = "sm3" }}, 1e-6, 2e-5},
		{config{name: "fp16", edit: func(o *passes.Options) { o.Precision = "fp16" }}, 1e-4, 0.1},
	} {
		t.Run(c.name, func(t *testing.T) {
			c.set, c.batch = tiny.set, tiny.batch
			loss, param, _ := compareWithCPU(t, rt, c.config, 3)
			t.Logf("%s, 3 steps: worst loss difference %.3g, worst param difference %.3g", c.name, loss, param)
			assert.LessOrEqual(t, loss, tol(c.loss, 1e-3))
			assert.LessOrEqual(t, param, tol(c.param, 0.2))
		})
	}
}
