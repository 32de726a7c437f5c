package cuda

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/lower"
	"gcompile/passes"
	"gcompile/runtime/cuda/driver"
)

// The fake GPU runs every call when it is queued, so a missing wait
// between the copy stream and the compute stream cannot show up in its
// numbers. These tests check the planned waits instead, on a planning
// device, whose events are distinct stand-in handles.

// planDevice prepares rank 0 of progs as Load would, without a GPU.
func planDevice(t *testing.T, progs []*lower.Program) *Device {
	t.Helper()
	prog := programOf(progs, 0)
	var cm comm
	if prog.Mesh != nil {
		cm = newFabric()
	}
	d, err := load(planningRuntime(), prog, Options{}, 0, cm)
	require.NoError(t, err)
	return d
}

// checkCopyOrder replays the planned waits of d the way a GPU orders
// them: the copy stream runs its copies in order, so a wait for one
// fetch covers every fetch issued before it. It reports every
// instruction that would touch a fetched buffer, or write host memory,
// before the compute stream waited for the fetch, and every fetched
// buffer freed without a wait (its bytes are handed to the next
// occupant). It returns the number of fetches seen.
func checkCopyOrder(t *testing.T, d *Device) int {
	t.Helper()
	seq := map[driver.Event]int{} // fetch event → issue order, from 1
	fetched := map[int]int{}      // buffer → issue order of its latest fetch
	issued, waited := 0, 0
	wait := func(es []driver.Event) {
		for _, e := range es {
			if s, ok := seq[e]; ok {
				waited = max(waited, s)
			}
		}
	}
	for i, in := range d.prog.Instrs {
		wait(d.waitBefore[i])
		if d.hostWrites[i] {
			assert.GreaterOrEqual(t, waited, issued, "instruction %d (%s) writes host memory while a fetch may still read it", i, in.Op)
		}
		_, isFetch := d.fetches[i]
		for _, id := range d.operands(i) {
			if isFetch && id == in.Out {
				continue // copies into one buffer stay in order on the copy stream
			}
			if s, ok := fetched[id]; ok {
				assert.GreaterOrEqual(t, waited, s, "instruction %d (%s) uses buffer %d before its fetch is waited for", i, in.Op, id)
			}
		}
		if e, ok := d.fetches[i]; ok {
			issued++
			seq[e] = issued
			fetched[in.Out] = issued
		}
		wait(d.waitAfter[i])
		for _, id := range in.Frees {
			if s, ok := fetched[id]; ok {
				assert.GreaterOrEqual(t, waited, s, "instruction %d (%s) frees buffer %d before its fetch is waited for", i, in.Op, id)
				delete(fetched, id)
			}
		}
	}
	return issued
}

// Every host-to-device copy of an offloaded program is waited for by the
// compute stream before its buffer is used or freed, and before host
// memory it may read is written.
func TestPlannedCopyWaitsOrderEveryFetch(t *testing.T) {
	for _, c := range []config{
		{name: "offload", lower: lower.Options{Offload: "optimizer,params"}},
		{name: "offload_optimizer_micro2", micro: 2, lower: lower.Options{Offload: "optimizer"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := planDevice(t, programs(t, c))
			n := checkCopyOrder(t, d)
			assert.Positive(t, n, "the program fetches nothing: the check saw no copy")
		})
	}
}

// The first all_reduce of a bucket copies and reduces every member's
// buffers, so a fetch into a later member's buffer must be waited for
// before the first one, not before the member's own (empty) instruction.
func TestCopyWaitsCoverABucketLeadersMembers(t *testing.T) {
	const fetchDone = driver.Event(7)
	prog := &lower.Program{Instrs: []lower.Instr{
		{Op: "copy", Args: []int{10}, Out: 1},
		{Op: "all_reduce", Args: []int{2}, Out: 3, Bucket: 1},
		{Op: "all_reduce", Args: []int{1}, Out: 4, Bucket: 1, Frees: []int{1}},
	}}
	d := &Device{prog: prog, fetches: map[int]driver.Event{0: fetchDone}, hostWrites: map[int]bool{},
		touches: map[int][]int{1: {1, 4}}}
	d.planCopyWaits()
	assert.Equal(t, []driver.Event{fetchDone}, d.waitBefore[1], "the leader reads member 2's argument")
	assert.Empty(t, d.waitBefore[2])
	assert.Empty(t, d.waitAfter[2])
	assert.Equal(t, 1, checkCopyOrder(t, d))
}

// Loading a bucketed program records, for each bucket's first
// all_reduce, the arguments and results of the members it reduces for.
func TestBucketLeaderTouchesItsMembers(t *testing.T) {
	c := config{name: "dp2_bucket", mesh: dp2, edit: func(o *passes.Options) { o.BucketMB = 0.01 }}
	d := planDevice(t, programs(t, c))
	instrs := d.prog.Instrs
	multi := 0
	for i, in := range instrs {
		if in.Op != "all_reduce" || in.Bucket == 0 || (i > 0 && instrs[i-1].Op == "all_reduce" && instrs[i-1].Bucket == in.Bucket) {
			assert.Empty(t, d.touches[i], "instruction %d (%s) is not a bucket's first all_reduce", i, in.Op)
			continue
		}
		var want []int
		for j := i + 1; j < len(instrs) && instrs[j].Op == "all_reduce" && instrs[j].Bucket == in.Bucket; j++ {
			want = append(want, instrs[j].Args[0], instrs[j].Out)
		}
		if len(want) > 0 {
			multi++
		}
		assert.Equal(t, want, d.touches[i], "bucket %d led by instruction %d", in.Bucket, i)
	}
	require.Positive(t, multi, "no bucket has more than one member: the test checks nothing")
}

// The kernels are compiled without FMA contraction and without any
// fast-math option: the kernels that mirror the CPU kernels' float32
// arithmetic round as they do.
func TestKernelOptionsKeepIEEEArithmetic(t *testing.T) {
	assert.Contains(t, kernelOptions, "--fmad=false")
	for _, o := range kernelOptions {
		for _, bad := range []string{"--use_fast_math", "-use_fast_math", "--ftz=true", "--prec-div=false", "--prec-sqrt=false", "--fmad=true"} {
			assert.NotEqual(t, bad, o)
		}
	}
}
