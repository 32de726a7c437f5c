package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/ir"
	"gcompile/lower"
	"gcompile/passes"
	"gcompile/runtime/cpu"
	"gcompile/runtime/cuda/fakegpu"
)

// dp2Buckets is the tiny GPT on two data-parallel devices with buckets
// small enough that the gradients fill several.
var dp2Buckets = config{name: "dp2_buckets", mesh: dp2, set: tiny.set, batch: 2, edit: func(o *passes.Options) { o.BucketMB = 0.004 }}

// overlaps reports whether two buffers' device bytes overlap.
func overlaps(d *Device, a, b int) bool {
	x, y := d.prog.Buffers[a], d.prog.Buffers[b]
	return !x.Host && !y.Host && x.Bytes > 0 && y.Bytes > 0 && x.Offset < y.Offset+y.Bytes && y.Offset < x.Offset+x.Bytes
}

// checkBucketWaits checks the planned waits of d's buckets: between a
// bucket and its wait no instruction touches the bytes of the bucket's
// results (which the comm stream is reducing) or runs a collective of the
// bucket's axis off the comm stream, the wait is the first instruction
// that does, and the compute stream waits there for the bucket's done
// event. It returns how many buckets leave instructions to overlap with.
func checkBucketWaits(t *testing.T, d *Device) (overlapped int) {
	t.Helper()
	instrs := d.prog.Instrs
	for _, b := range d.buckets {
		end := b.leader + b.members
		hits := func(j int) bool {
			in := instrs[j]
			if ir.Collectives[in.Op] && in.Attrs.Str("axis") == b.axis && !d.onComm[j] {
				return true
			}
			for _, id := range d.operands(j) {
				for _, out := range b.outs {
					if overlaps(d, id, out) {
						return true
					}
				}
			}
			return false
		}
		stop := len(instrs)
		if b.wait >= 0 {
			stop = b.wait
			require.True(t, hits(b.wait), "bucket of instruction %d waits before instruction %d (%s), which needs nothing of it", b.leader, b.wait, instrs[b.wait].Op)
			assert.Contains(t, d.waitBefore[b.wait], b.done)
		}
		for j := end; j < stop; j++ {
			require.False(t, hits(j), "instruction %d (%s) touches the bucket of instruction %d before waiting for it", j, instrs[j].Op, b.leader)
		}
		for _, out := range b.outs {
			for j := end; j < len(instrs); j++ {
				if slices.Contains(instrs[j].Args, out) {
					assert.GreaterOrEqual(t, j, b.wait, "the reduced gradient's first reader waits")
					assert.GreaterOrEqual(t, b.wait, 0)
					break
				}
			}
		}
		if b.wait > end {
			overlapped++
		}
	}
	return overlapped
}

// Every gradient bucket is reduced on the comm stream and waited for only
// where its results are needed: on every device of data-parallel plans
// with buckets, alone, with ZeRO-1 and 2 (buckets of reduce-scatters),
// microbatches and tensor parallelism.
func TestPlannedBucketWaits(t *testing.T) {
	for _, c := range []config{
		dp2Buckets,
		{name: "dp2_zero1_buckets", mesh: dp2, edit: func(o *passes.Options) { o.Zero = 1; o.BucketMB = 0.01 }},
		{name: "dp2_zero2_micro2_buckets", mesh: dp2, micro: 2, edit: func(o *passes.Options) { o.Zero = 2; o.BucketMB = 0.01 }},
		{name: "dp2_micro2_buckets", mesh: dp2, micro: 2, edit: func(o *passes.Options) { o.BucketMB = 0.01 }},
		{name: "dp2_tp2_buckets", mesh: dp2tp2, edit: func(o *passes.Options) { o.BucketMB = 0.01 }},
	} {
		t.Run(c.name, func(t *testing.T) {
			progs := programs(t, c)
			for r := range devices(progs) {
				prog := programOf(progs, r)
				var cm comm = newFabric()
				d, err := load(planningRuntime(), prog, Options{}, r, cm)
				require.NoError(t, err)
				require.Greater(t, len(d.buckets), 1, "device %d: the gradients fill several buckets", r)
				n := checkBucketWaits(t, d)
				assert.Positive(t, n, "device %d: some bucket's reduction overlaps the backward", r)
				plan, _, err := Plan(progs, r)
				require.NoError(t, err)
				for _, b := range d.buckets {
					assert.Contains(t, plan[b.leader].Steps, fmt.Sprintf("bucket of %d %ss on the comm stream", b.members, prog.Instrs[b.leader].Op))
					if b.wait >= 0 {
						assert.Contains(t, plan[b.wait].Steps, fmt.Sprintf("wait for the bucket reduced by instruction %d", b.leader))
					}
				}
			}
		})
	}
}

// traceStep runs one step of cl on the fake GPU with its call trace on,
// every instruction marked "dev R instr I" as it is issued, and returns
// the trace.
func traceStep(t *testing.T, libs fakegpu.Libs, cl *Cluster) []fakegpu.TraceCall {
	t.Helper()
	var mu sync.Mutex
	var markErr error
	for _, d := range cl.Devices {
		d.onIssue = func(i int) {
			if err := libs.TraceMark(fmt.Sprintf("dev %d instr %d", d.rank, i)); err != nil {
				mu.Lock()
				markErr = err
				mu.Unlock()
			}
		}
	}
	require.NoError(t, libs.StartTrace())
	stepErr := cl.Step()
	calls, err := libs.StopTrace()
	for _, d := range cl.Devices {
		d.onIssue = nil
	}
	require.NoError(t, stepErr)
	require.NoError(t, err)
	require.NoError(t, markErr)
	return calls
}

// stepBesideCPU gives cl and a CPU backend cluster of progs the same
// params and batch and runs one step of each: cl's call trace, and the
// CPU cluster to compare with.
func stepBesideCPU(t *testing.T, libs fakegpu.Libs, cl *Cluster, progs []*lower.Program, batch int) ([]fakegpu.TraceCall, *cpu.Cluster) {
	t.Helper()
	ref, err := cpu.NewPipelineCluster(progs, cpu.Options{})
	require.NoError(t, err)
	require.NoError(t, cl.InitParams(1))
	require.NoError(t, ref.InitParams(1))
	setBatch(t, batch, cl, ref)
	calls := traceStep(t, libs, cl)
	require.NoError(t, ref.Step())
	return calls, ref
}

// deviceTrace is what device d did in a trace: its marks and the calls on
// its compute and comm streams, in order.
func deviceTrace(calls []fakegpu.TraceCall, d *Device) []fakegpu.TraceCall {
	prefix := fmt.Sprintf("dev %d instr ", d.rank)
	var out []fakegpu.TraceCall
	for _, c := range calls {
		if c.Op == "mark" && len(c.Name) > len(prefix) && c.Name[:len(prefix)] == prefix ||
			c.Op != "mark" && (c.Stream == uintptr(d.compute) || c.Stream == uintptr(d.comms)) {
			out = append(out, c)
		}
	}
	return out
}

// setBatch gives a cluster the same random batch and scalars as ref.
func setBatch(t *testing.T, batch int, devs ...interface {
	SetInt32(string, []int32) error
	SetScalar(string, float64) error
}) {
	r := rand.New(rand.NewPCG(4, 2))
	tokens, targets := make([]int32, batch*testSeq), make([]int32, batch*testSeq)
	for i := range tokens {
		tokens[i], targets[i] = int32(r.IntN(256)), int32(r.IntN(256))
	}
	for _, d := range devs {
		require.NoError(t, d.SetInt32("tokens", tokens))
		require.NoError(t, d.SetInt32("targets", targets))
		require.NoError(t, d.SetScalar("lr", 1e-3))
		require.NoError(t, d.SetScalar("step", 1))
	}
}

// On the fake GPU, whose call trace shows what the backend asked for: a
// bucket's gradients are copied on the compute stream, which records an
// event; the comm stream waits for that event before it reduces, and
// records one after; the compute stream waits for that one at the
// planned instruction, before any of that instruction's work, and has
// queued other work in between. The step's loss and weights are the CPU
// backend's bit for bit (the fabric adds in the CPU's order).
func TestBucketReductionRunsOnTheCommStream(t *testing.T) {
	if onGPU() {
		t.Skip("reads the fake GPU's call trace")
	}
	slow(t)
	rt := openTest(t)
	libs := fakegpu.Install(t)
	progs := programs(t, dp2Buckets)
	cl, err := NewPipelineCluster(rt, progs, Options{})
	require.NoError(t, err)
	defer func() { assert.NoError(t, cl.Close()) }()
	calls, ref := stepBesideCPU(t, libs, cl, progs, dp2Buckets.batch)

	for _, d := range cl.Devices {
		require.NotZero(t, d.comms)
		require.NotEqual(t, d.comms, d.compute)
		tr := deviceTrace(calls, d)
		mark := func(i int) int {
			k := slices.IndexFunc(tr, func(c fakegpu.TraceCall) bool {
				return c.Op == "mark" && c.Name == fmt.Sprintf("dev %d instr %d", d.rank, i)
			})
			require.GreaterOrEqual(t, k, 0, "device %d: instruction %d was not issued", d.rank, i)
			return k
		}
		find := func(from int, f func(c fakegpu.TraceCall) bool) int {
			for k := from; k < len(tr); k++ {
				if f(tr[k]) {
					return k
				}
			}
			return -1
		}
		onComm := func(c fakegpu.TraceCall) bool {
			return c.Stream == uintptr(d.comms) && (c.Op == "launch" || c.Op == "copy")
		}
		overlapped := 0
		for _, b := range d.buckets {
			at := mark(b.leader)
			ready := find(at, func(c fakegpu.TraceCall) bool {
				return c.Op == "record" && c.Event == uintptr(b.ready)
			})
			require.Positive(t, ready, "device %d: bucket %d records its ready event", d.rank, b.leader)
			assert.Equal(t, uintptr(d.compute), tr[ready].Stream, "ready is recorded on the compute stream")
			assert.Positive(t, find(at, func(c fakegpu.TraceCall) bool { return c.Op == "copy" && c.Stream == uintptr(d.compute) }), "the gradients are copied on the compute stream")
			wait := find(at, func(c fakegpu.TraceCall) bool { return c.Op == "wait" && c.Event == uintptr(b.ready) })
			require.Greater(t, wait, ready, "device %d: the comm stream waits for the gradients", d.rank)
			assert.Equal(t, uintptr(d.comms), tr[wait].Stream)
			work := find(at, onComm)
			require.Greater(t, work, wait, "device %d: the reduction runs on the comm stream after its wait", d.rank)
			assert.Equal(t, "gc_add", tr[find(at, func(c fakegpu.TraceCall) bool { return onComm(c) && c.Op == "launch" })].Name)
			done := find(work, func(c fakegpu.TraceCall) bool { return c.Op == "record" && c.Event == uintptr(b.done) })
			require.Positive(t, done, "device %d: the comm stream records done", d.rank)
			assert.Equal(t, uintptr(d.comms), tr[done].Stream)
			require.GreaterOrEqual(t, b.wait, 0, "the optimizer reads every bucket")
			w := mark(b.wait)
			require.Greater(t, w, done)
			back := find(w, func(c fakegpu.TraceCall) bool { return c.Op == "wait" && c.Event == uintptr(b.done) })
			require.Positive(t, back, "device %d: the compute stream waits for bucket %d", d.rank, b.leader)
			assert.Equal(t, uintptr(d.compute), tr[back].Stream)
			next := find(w, func(c fakegpu.TraceCall) bool {
				return c.Stream == uintptr(d.compute) && (c.Op == "launch" || c.Op == "copy" || c.Op == "memset")
			})
			assert.Greater(t, next, back, "device %d: instruction %d's work is queued after its wait", d.rank, b.wait)
			assert.Equal(t, -1, slices.IndexFunc(tr[done:w], func(c fakegpu.TraceCall) bool {
				return c.Op == "wait" && c.Event == uintptr(b.done)
			}), "no earlier wait for the bucket")
			between := slices.IndexFunc(tr[done:w], func(c fakegpu.TraceCall) bool { return c.Op == "launch" && c.Stream == uintptr(d.compute) })
			if between >= 0 {
				overlapped++
			}
		}
		assert.Positive(t, overlapped, "device %d: compute work is queued while a bucket is reduced", d.rank)
		for _, c := range tr {
			if c.Op == "launch" && c.Stream == uintptr(d.comms) {
				assert.Equal(t, "gc_add", c.Name, "only the reductions run on the comm stream")
			}
		}
	}
	// The kernels' own differences from the CPU's, which where the
	// reduction runs does not change (bucketed and unbucketed agree to
	// the bit, below).
	loss, param := stepDiff(t, ref, cl, progs)
	t.Logf("one step against the CPU backend: loss difference %.3g, worst param difference %.3g", loss, param)
	assert.LessOrEqual(t, loss, 1e-6)
	assert.LessOrEqual(t, param, 1e-4)

	// Unbucketed, every gradient is reduced alone on the compute stream,
	// in the same order of additions: the weights are the same bits.
	plain := dp2Buckets
	plain.edit = func(o *passes.Options) { o.Disable = []string{"data-parallel"} }
	plainProgs := programs(t, plain)
	unbucketed, err := NewPipelineCluster(rt, plainProgs, Options{})
	require.NoError(t, err)
	defer func() { assert.NoError(t, unbucketed.Close()) }()
	require.NoError(t, unbucketed.InitParams(1))
	setBatch(t, dp2Buckets.batch, unbucketed)
	require.NoError(t, unbucketed.Step())
	assert.Empty(t, unbucketed.Devices[0].buckets)
	sameWeights(t, progs[0], unbucketed, cl, "unbucketed vs bucketed on the comm stream")

	// --overlap-grad-reduce=false: the same buckets, each reduced where
	// it stands on the compute stream; no comm stream, every kernel on a
	// compute stream, and the same bits.
	inOrder := dp2Buckets
	inOrder.lower = lower.Options{SerialBuckets: true}
	serialProgs := programs(t, inOrder)
	serial, err := NewPipelineCluster(rt, serialProgs, Options{})
	require.NoError(t, err)
	defer func() { assert.NoError(t, serial.Close()) }()
	require.NoError(t, serial.InitParams(1))
	setBatch(t, dp2Buckets.batch, serial)
	calls = traceStep(t, libs, serial)
	for _, d := range serial.Devices {
		assert.Empty(t, d.buckets)
		assert.Zero(t, d.comms, "device %d: no comm stream", d.rank)
		plan, _, err := Plan(serialProgs, d.rank)
		require.NoError(t, err)
		ons := 0
		for _, p := range plan {
			for _, s := range p.Steps {
				if strings.HasPrefix(s, "bucket of ") {
					assert.Contains(t, s, "on the compute stream")
					ons++
				}
			}
		}
		assert.Greater(t, ons, 1, "device %d: the gradients still fill several buckets", d.rank)
	}
	compute := map[uintptr]bool{}
	for _, d := range serial.Devices {
		compute[uintptr(d.compute)] = true
	}
	for _, c := range calls {
		if c.Op == "launch" {
			require.True(t, compute[c.Stream], "%s launched off the compute streams", c.Name)
		}
	}
	sameWeights(t, progs[0], serial, cl, "buckets in order vs on the comm stream")
}

// ZeRO's buckets of reduce-scatters on the fake GPU: each bucket's
// gradients are cut into its staging buffer on the compute stream, which
// records ready; the comm stream waits for it, reduces and copies the
// shards into their results, and records done, which the compute stream
// waits for where the optimizer reads them. The two staging buffers are
// taken in turn, and the cuts into one wait for the bucket before last to
// be done with it. The weights are the bits of the same buckets reduced
// in place on the compute stream (--overlap-grad-reduce=false), and of
// the gradients reduce-scattered one at a time.
func TestScatterBucketsRunOnTheCommStream(t *testing.T) {
	if onGPU() {
		t.Skip("reads the fake GPU's call trace")
	}
	slow(t)
	rt := openTest(t)
	libs := fakegpu.Install(t)
	zero1 := dp2Buckets
	zero1.edit = func(o *passes.Options) { o.BucketMB = 0.004; o.Zero = 1 }
	progs := programs(t, zero1)
	cl, err := NewPipelineCluster(rt, progs, Options{})
	require.NoError(t, err)
	defer func() { assert.NoError(t, cl.Close()) }()
	calls, ref := stepBesideCPU(t, libs, cl, progs, zero1.batch)
	for _, d := range cl.Devices {
		require.Greater(t, len(d.scatterPlans), 2, "device %d: buckets enough to reuse a staging buffer", d.rank)
		// A gradient larger than a bucket (the token embedding's) is a
		// bucket of its own, reduce-scattered where it stands: the staging
		// buffers hold buckets of several gradients, at most --bucket-mb
		// (4 KiB here) each, not the largest gradient.
		var largest int64
		single := 0
		for i, in := range d.prog.Instrs {
			if in.Op != "reduce_scatter" || in.Bucket == 0 {
				continue
			}
			largest = max(largest, in.ArgTypes[0].Bytes())
			if run, leads := d.prog.BucketRun(i); leads && len(run) == 1 {
				single++
				assert.False(t, d.onComm[i], "device %d: a bucket of one gradient runs on the compute stream", d.rank)
			}
		}
		assert.Positive(t, single, "a gradient larger than a bucket")
		assert.Greater(t, largest, int64(4<<10))
		for _, b := range d.scatterPlans {
			var whole int64
			for _, m := range d.prog.Instrs[b.leader : b.leader+b.members] {
				whole += m.ArgTypes[0].Bytes()
			}
			assert.LessOrEqual(t, float64(whole), 0.004*(1<<20), "device %d: bucket %d", d.rank, b.leader)
		}
		assert.Less(t, d.Workspace().Keep, 2*largest, "device %d: staging sized by the buckets, not the largest gradient", d.rank)
		tr := deviceTrace(calls, d)
		find := func(from int, f func(c fakegpu.TraceCall) bool) int {
			for k := from; k < len(tr); k++ {
				if f(tr[k]) {
					return k
				}
			}
			return -1
		}
		for j, b := range d.scatterPlans {
			at := find(0, func(c fakegpu.TraceCall) bool {
				return c.Op == "mark" && c.Name == fmt.Sprintf("dev %d instr %d", d.rank, b.leader)
			})
			require.GreaterOrEqual(t, at, 0)
			cut := find(at, func(c fakegpu.TraceCall) bool { return c.Op == "launch" && c.Name == "gc_slice" })
			ready := find(at, func(c fakegpu.TraceCall) bool { return c.Op == "record" && c.Event == uintptr(b.ready) })
			require.Positive(t, cut, "device %d: bucket %d cuts its gradients", d.rank, j)
			require.Greater(t, ready, cut, "device %d: bucket %d records ready after its cuts", d.rank, j)
			assert.Equal(t, uintptr(d.compute), tr[cut].Stream, "the cuts run on the compute stream")
			if j >= 2 {
				reuse := find(at, func(c fakegpu.TraceCall) bool {
					return c.Op == "wait" && c.Event == uintptr(d.scatterPlans[j-2].done)
				})
				require.Positive(t, reuse, "device %d: bucket %d waits for bucket %d's staging", d.rank, j, j-2)
				assert.Less(t, reuse, cut, "before its cuts")
				assert.Equal(t, uintptr(d.compute), tr[reuse].Stream)
			}
			wait := find(ready, func(c fakegpu.TraceCall) bool { return c.Op == "wait" && c.Event == uintptr(b.ready) })
			require.Positive(t, wait)
			assert.Equal(t, uintptr(d.comms), tr[wait].Stream, "the comm stream waits for the cuts")
			done := find(wait, func(c fakegpu.TraceCall) bool { return c.Op == "record" && c.Event == uintptr(b.done) })
			require.Positive(t, done)
			assert.Equal(t, uintptr(d.comms), tr[done].Stream)
			// After the fabric's sum (a copy, then an add a member), each
			// shard is copied into its result.
			copies, added := 0, false
			for _, c := range tr[wait:done] {
				switch {
				case c.Stream != uintptr(d.comms):
				case c.Op == "launch":
					require.Equal(t, "gc_add", c.Name, "only the sums are launched on the comm stream")
					copies, added = 0, true
				case c.Op == "copy":
					copies++
				}
			}
			assert.True(t, added, "device %d: bucket %d is summed on the comm stream", d.rank, j)
			assert.Equal(t, b.members, copies, "device %d: each shard is copied into its result on the comm stream", d.rank)
			require.GreaterOrEqual(t, b.wait, 0, "the optimizer reads every bucket")
		}
	}
	loss, param := stepDiff(t, ref, cl, progs)
	assert.LessOrEqual(t, loss, 1e-6)
	assert.LessOrEqual(t, param, 1e-4)

	serial := zero1
	serial.lower = lower.Options{SerialBuckets: true}
	serialProgs := programs(t, serial)
	inOrder, err := NewPipelineCluster(rt, serialProgs, Options{})
	require.NoError(t, err)
	defer func() { assert.NoError(t, inOrder.Close()) }()
	require.NoError(t, inOrder.InitParams(1))
	setBatch(t, zero1.batch, inOrder)
	require.NoError(t, inOrder.Step())
	assert.Empty(t, inOrder.Devices[0].scatterPlans)
	sameWeights(t, progs[0], inOrder, cl, "reduce-scatter buckets in order vs on the comm stream")

	plain := zero1
	plain.edit = func(o *passes.Options) { o.Zero = 1; o.Disable = []string{"data-parallel"} }
	plainProgs := programs(t, plain)
	unbucketed, err := NewPipelineCluster(rt, plainProgs, Options{})
	require.NoError(t, err)
	defer func() { assert.NoError(t, unbucketed.Close()) }()
	require.NoError(t, unbucketed.InitParams(1))
	setBatch(t, zero1.batch, unbucketed)
	require.NoError(t, unbucketed.Step())
	assert.Empty(t, unbucketed.Devices[0].scatterPlans)
	sameWeights(t, progs[0], unbucketed, cl, "unbucketed vs bucketed reduce-scatters")
}

// sameWeights checks that two clusters hold the same bits in every param
// and optimizer state of prog after a step.
func sameWeights(t *testing.T, prog *lower.Program, a, b *Cluster, what string) {
	t.Helper()
	checked := 0
	for _, buf := range prog.Buffers {
		if buf.Kind == lower.Param || buf.Kind == lower.State {
			x, err := a.Global(buf.Name)
			require.NoError(t, err)
			y, err := b.Global(buf.Name)
			require.NoError(t, err)
			require.Equal(t, x, y, "%s after the step: %s", buf.Name, what)
			checked++
		}
	}
	assert.Greater(t, checked, 20)
}

// stepDiff compares one step of two clusters: the relative loss
// difference and the worst param difference relative to each tensor's
// largest entry (key biases aside, see isKeyBias).
func stepDiff(t *testing.T, ref, got trainer, progs []*lower.Program) (loss, param float64) {
	t.Helper()
	want, err := ref.Scalar("loss")
	require.NoError(t, err)
	have, err := got.Scalar("loss")
	require.NoError(t, err)
	loss = relDiff(have, want)
	for _, b := range progs[0].Buffers {
		if b.Kind != lower.Param {
			continue
		}
		w, err := ref.Global(b.Name)
		require.NoError(t, err)
		g, err := got.Global(b.Name)
		require.NoError(t, err)
		scale := 0.0
		for _, v := range w {
			scale = max(scale, math.Abs(v))
		}
		for i := range w {
			if !isKeyBias(b.Name, i) {
				param = max(param, math.Abs(g[i]-w[i])/scale)
			}
		}
	}
	return loss, param
}

// Over NCCL (one fake GPU per device), a bucket's all-reduce is queued on
// the comm stream too, and the step matches the CPU backend's (the fake
// NCCL adds in rank order).
func TestBucketAllReduceOnTheCommStreamOverNCCL(t *testing.T) {
	if onGPU() {
		t.Skip("needs two GPUs and reads the fake GPU's call trace")
	}
	slow(t)
	libs, rts := fakeGPUs(t, 2)
	progs := programs(t, dp2Buckets)
	cl, err := NewNCCLCluster(rts, progs, Options{})
	require.NoError(t, err)
	defer func() { assert.NoError(t, cl.Close()) }()
	calls, ref := stepBesideCPU(t, libs, cl, progs, dp2Buckets.batch)
	for _, d := range cl.Devices {
		var onComm, onCompute int
		for _, c := range calls {
			if c.Op == "nccl" && c.Name == "ncclAllReduce" {
				switch c.Stream {
				case uintptr(d.comms):
					onComm++
				case uintptr(d.compute):
					onCompute++
				}
			}
		}
		members := 0
		for _, b := range d.buckets {
			members += b.members
		}
		assert.Equal(t, members, onComm, "device %d: every bucketed gradient is reduced on the comm stream", d.rank)
		t.Logf("device %d: %d all-reduces on the comm stream in %d buckets, %d on the compute stream", d.rank, onComm, len(d.buckets), onCompute)
	}
	loss, param := stepDiff(t, ref, cl, progs)
	t.Logf("one step against the CPU backend: loss difference %.3g, worst param difference %.3g", loss, param)
	assert.LessOrEqual(t, loss, 1e-6)
	assert.LessOrEqual(t, param, 1e-4)
}
