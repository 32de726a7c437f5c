package cuda

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/ir"
	"gcompile/lower"
	"gcompile/runtime/cuda/driver"
)

// One rank per GPU goes through NCCL: the communicator of a group is made
// with ncclCommInitRank inside a group call, and each collective is queued
// on the device's compute stream. Only one rank can be tested on one GPU
// (and the fake NCCL has one rank): with one member every collective
// leaves its data as it is, which checks the calls' buffers and counts.
func TestNCCLOneRank(t *testing.T) {
	rt := openTest(t)
	if _, err := rt.NCCL(); err != nil && onGPU() {
		t.Skipf("this GPU machine has no NCCL: %v", err)
	}
	const k = 8
	prog := meshProgram(1, 1<<12)
	progs := []*lower.Program{prog}
	cm, err := newNCCLComm(map[int]*Runtime{0: rt}, progs, localIDs)
	require.NoError(t, err)
	cl, err := newCluster([]*Runtime{rt}, []int{0}, progs, Options{}, cm, &NCCLJob{}, nil)
	require.NoError(t, err)
	defer func() { assert.NoError(t, cl.Close()) }()
	d := cl.Devices[0]
	input := make([]float32, k)
	for i := range input {
		input[i] = float32(i) - 2.5
	}
	got := map[string][]float32{}
	err = d.hostIO(func() error {
		drv := rt.drv
		at := func(i int) driver.DevicePtr { return d.mem.arena.Add(uint64(i * 4 * k)) }
		if err := drv.MemcpyHtoD(at(0), f32s(input)); err != nil {
			return err
		}
		if err := drv.MemcpyHtoD(at(1), f32s(input)); err != nil {
			return err
		}
		g := newGroup([]int{0}, 0)
		if err := cm.allReduce(d, g, nil, []driver.DevicePtr{at(1)}, []int64{k}, 0); err != nil {
			return err
		}
		if err := cm.reduceScatter(d, g, nil, d.compute, ir.F32, at(0), at(2), k); err != nil {
			return err
		}
		if err := cm.allGather(d, g, nil, at(0), at(3), 4*k); err != nil {
			return err
		}
		if err := cm.allToAll(d, g, nil, at(0), at(4), 4*k); err != nil {
			return err
		}
		if err := drv.StreamSynchronize(d.compute); err != nil {
			return err
		}
		for i, name := range []string{"all_reduce", "reduce_scatter", "all_gather", "all_to_all"} {
			raw := make([]byte, 4*k)
			if err := drv.MemcpyDtoH(raw, at(i+1)); err != nil {
				return err
			}
			got[name] = fromBytes(raw)
		}
		return nil
	})
	require.NoError(t, err)
	for name, x := range got {
		assert.Equal(t, input, x, name)
	}
}

// NCCL pairs sends with receives by their order on a pair's communicator,
// not by tag: each device's receiving end is laid out, at load, in the
// order the sender's program sends, whatever order its own program
// receives in (a pipeline's tied embedding goes out first and is used
// last).
func TestNCCLPipelineInboxesFollowTheSendersOrder(t *testing.T) {
	if onGPU() {
		t.Skip("needs two GPUs; the fake GPU makes two")
	}
	_, rts := fakeGPUs(t, 2)
	progs := programs(t, config{name: "pp2", mesh: pp2, pp: 2, micro: 2})
	cl, err := NewNCCLCluster(rts, progs, Options{})
	require.NoError(t, err)
	defer func() { assert.NoError(t, cl.Close()) }()
	for r, d := range cl.Devices {
		peer := 1 - r
		box := d.inboxes[peer]
		require.NotNil(t, box, "device %d receives from device %d", r, peer)
		var sent, received []int
		for _, in := range progs[peer].Instrs {
			if in.Op == "send" {
				sent = append(sent, in.Tag)
			}
		}
		for _, m := range box.msgs {
			received = append(received, m.tag)
		}
		assert.Equal(t, sent, received, "device %d posts its receives in device %d's send order", r, peer)
	}
	_, err = NewNCCLCluster([]*Runtime{rts[0]}, progs, Options{})
	assert.ErrorContains(t, err, "the mesh has 2 devices; NCCL runs one per GPU and 1 GPUs were given")
}
