package nccl_test

import (
	"encoding/binary"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/runtime/cuda/driver/drivertest"
	"gcompile/runtime/cuda/nccl"
)

// A communicator of one rank exercises the real library on a single GPU.
func TestRealNCCLWorldOfOne(t *testing.T) {
	g := drivertest.Open(t, "test against the real NCCL")
	d, s := g.Driver, g.Stream

	n, err := nccl.Load()
	require.NoError(t, err)
	v, err := n.Version()
	require.NoError(t, err)
	t.Logf("NCCL %d from %s, native all-to-all: %v", v, n.Path(), n.HasAllToAll())
	id, err := n.GetUniqueID()
	require.NoError(t, err)
	c, err := n.CommInitRank(1, id, 0)
	require.NoError(t, err)
	defer n.CommDestroy(c)
	count, err := n.CommCount(c)
	require.NoError(t, err)
	assert.Equal(t, 1, count)

	const elems = 1024
	in := make([]byte, 4*elems)
	for i := 0; i < elems; i++ {
		binary.LittleEndian.PutUint32(in[4*i:], math.Float32bits(float32(i)/8))
	}
	src, err := d.MemAlloc(4 * elems)
	require.NoError(t, err)
	defer d.MemFree(src)
	dst, err := d.MemAlloc(4 * elems)
	require.NoError(t, err)
	defer d.MemFree(dst)
	require.NoError(t, d.MemcpyHtoD(src, in))

	out := make([]byte, len(in))
	for name, run := range map[string]func() error{
		"all-reduce": func() error { return n.AllReduce(src, dst, elems, nccl.Float32, nccl.Sum, c, s) },
		"all-gather": func() error { return n.AllGather(src, dst, elems, nccl.Float32, c, s) },
		"broadcast":  func() error { return n.Broadcast(src, dst, elems, nccl.Float32, 0, c, s) },
		"all-to-all": func() error { return n.AllToAll(src, dst, elems, nccl.Float32, c, s) },
		"send/recv": func() error {
			if err := n.GroupStart(); err != nil {
				return err
			}
			err1 := n.Send(src, elems, nccl.Float32, 0, c, s)
			err2 := n.Recv(dst, elems, nccl.Float32, 0, c, s)
			err3 := n.GroupEnd()
			for _, e := range []error{err1, err2, err3} {
				if e != nil {
					return e
				}
			}
			return nil
		},
	} {
		require.NoError(t, d.MemsetD8(dst, 0, 4*elems))
		// The memset runs on the legacy stream, which s does not wait for.
		require.NoError(t, d.Synchronize())
		require.NoError(t, run(), name)
		require.NoError(t, d.StreamSynchronize(s))
		require.NoError(t, d.MemcpyDtoH(out, dst))
		assert.Equal(t, in, out, "%s over one rank copies its input", name)
	}
}

// The failure-handling entry points and the optional split, on one rank
// of the real library.
func TestRealNCCLAbortSplitAndAsyncError(t *testing.T) {
	drivertest.Open(t, "test against the real NCCL")
	n, err := nccl.Load()
	require.NoError(t, err)
	id, err := n.GetUniqueID()
	require.NoError(t, err)
	c, err := n.CommInitRank(1, id, 0)
	require.NoError(t, err)
	res, err := n.CommGetAsyncError(c)
	require.NoError(t, err)
	assert.Equal(t, nccl.Success, res)
	if n.HasCommSplit() {
		sub, err := n.CommSplit(c, 0, 0)
		require.NoError(t, err)
		count, err := n.CommCount(sub)
		require.NoError(t, err)
		assert.Equal(t, 1, count)
		require.NoError(t, n.CommDestroy(sub))
		none, err := n.CommSplit(c, nccl.SplitNoColor, 0)
		require.NoError(t, err)
		assert.Zero(t, none)
	} else {
		t.Logf("NCCL at %s has no ncclCommSplit", n.Path())
	}
	require.NoError(t, n.CommAbort(c))
}
