package nccl

import (
	"encoding/binary"
	"errors"
	"math"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/runtime/cuda/dl"
	"gcompile/runtime/cuda/dl/dltest"
	"gcompile/runtime/cuda/driver"
)

type fakeLib struct {
	lastID        func(out *byte)
	lastNranks    func() int32
	lastRank      func() int32
	liveComms     func() int64
	lastStream    func() uintptr
	groupDepth    func() int32
	nativeAll     func() int32
	sends, recvs  func() int32
	sentFirst     func(p int32) int32
	sentBytes     func(p int32) uint64
	peerByteInLib func(p, r int32, j uint64) uint8
}

func loadFake(t *testing.T, cflags ...string) (*NCCL, *fakeLib) {
	t.Helper()
	path := dltest.Build(t, "testdata/fake_nccl.c", "libnccl.so.2", cflags...)
	t.Setenv("GCOMPILE_LIBNCCL", path)
	n, err := Load()
	require.NoError(t, err)
	t.Cleanup(func() { n.Close() })
	require.Equal(t, path, n.Path())
	f := &fakeLib{}
	require.NoError(t, n.lib.BindAll([]dl.Symbol{
		dl.Sym(&f.lastID, "fake_last_id"),
		dl.Sym(&f.lastNranks, "fake_last_nranks"),
		dl.Sym(&f.lastRank, "fake_last_rank"),
		dl.Sym(&f.liveComms, "fake_live_comms"),
		dl.Sym(&f.lastStream, "fake_last_stream"),
		dl.Sym(&f.groupDepth, "fake_group_depth"),
		dl.Sym(&f.nativeAll, "fake_native_alltoall"),
		dl.Sym(&f.sends, "fake_sends"),
		dl.Sym(&f.recvs, "fake_recvs"),
		dl.Sym(&f.sentFirst, "fake_sent_first"),
		dl.Sym(&f.sentBytes, "fake_sent_bytes"),
		dl.Sym(&f.peerByteInLib, "fake_peer_byte"),
	}))
	return n, f
}

// peerByte is what the stand-in says peer p sent to rank r at byte j.
func peerByte(p, r int, j uint64) byte { return byte(uint64(p*31+r*7) + j*3 + 1) }

// ptr is a host buffer's address as a device pointer: the stand-in library
// reads and writes "device" memory directly.
func ptr(b []byte) driver.DevicePtr { return driver.DevicePtr(uintptr(unsafe.Pointer(&b[0]))) }

func f32s(v ...float32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return b
}

func floats(b []byte) []float32 {
	out := make([]float32, len(b)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return out
}

func initComm(t *testing.T, n *NCCL, nranks, rank int) Comm {
	t.Helper()
	id, err := n.GetUniqueID()
	require.NoError(t, err)
	c, err := n.CommInitRank(nranks, id, rank)
	require.NoError(t, err)
	t.Cleanup(func() { n.CommDestroy(c) })
	return c
}

func TestVersion(t *testing.T) {
	n, _ := loadFake(t)
	v, err := n.Version()
	require.NoError(t, err)
	assert.Equal(t, 22803, v)
}

func TestUniqueIDPassesByValue(t *testing.T) {
	n, f := loadFake(t)
	id, err := n.GetUniqueID()
	require.NoError(t, err)
	for i, b := range id.Bytes() {
		require.Equal(t, byte(i*7+3), b, "byte %d written through the pointer", i)
	}

	// A distinctive id, as another rank would have received it.
	raw := make([]byte, UniqueIDBytes)
	for i := range raw {
		raw[i] = byte(i) ^ 0x5A
	}
	raw[0], raw[127] = 0xFF, 0x01
	id, err = UniqueIDFromBytes(raw)
	require.NoError(t, err)
	c, err := n.CommInitRank(4, id, 3)
	require.NoError(t, err)

	got := make([]byte, UniqueIDBytes)
	f.lastID(&got[0])
	assert.Equal(t, raw, got, "all 128 bytes arrived by value")
	assert.Equal(t, int32(4), f.lastNranks(), "the int before the struct")
	assert.Equal(t, int32(3), f.lastRank(), "the int after the struct")
	assert.Equal(t, int64(1), f.liveComms())

	count, err := n.CommCount(c)
	require.NoError(t, err)
	assert.Equal(t, 4, count)
	rank, err := n.CommUserRank(c)
	require.NoError(t, err)
	assert.Equal(t, 3, rank)
	require.NoError(t, n.CommDestroy(c))
	assert.Equal(t, int64(0), f.liveComms())
}

func TestCommInitRankErrors(t *testing.T) {
	n, f := loadFake(t)
	_, err := n.CommInitRank(2, UniqueID{}, 0)
	require.ErrorIs(t, err, InvalidArgument)
	assert.EqualError(t, err, "nccl: rank 0 of 2: ncclCommInitRank: ncclInvalidArgument: "+
		"invalid argument (run with NCCL_DEBUG=WARN for details) (last NCCL error: unique id was never initialised)")

	id, err := n.GetUniqueID()
	require.NoError(t, err)
	before := f.lastRank()
	for _, tc := range [][2]int{{2, 2}, {2, -1}, {0, 0}} {
		_, err = n.CommInitRank(tc[0], id, tc[1])
		require.Error(t, err)
		assert.Contains(t, err.Error(), "out of range")
	}
	assert.Equal(t, before, f.lastRank(), "bad ranks are refused before NCCL")
}

func TestAllReduce(t *testing.T) {
	n, f := loadFake(t)
	const nranks, rank = 4, 1
	c := initComm(t, n, nranks, rank)
	send := []float32{1, -2, 3.5, 0, 10}
	// Peer p contributes send[i] + (p - rank).
	tests := []struct {
		op   RedOp
		want func(x float32) float32
	}{
		{Sum, func(x float32) float32 { return 4*x + (-1 + 0 + 1 + 2) }},
		{Max, func(x float32) float32 { return x + 2 }},
		{Min, func(x float32) float32 { return x - 1 }},
		{Avg, func(x float32) float32 { return (4*x + 2) / 4 }},
	}
	for _, tt := range tests {
		sb := f32s(send...)
		rb := make([]byte, len(sb))
		require.NoError(t, n.AllReduce(ptr(sb), ptr(rb), uint64(len(send)), Float32, tt.op, c, driver.Stream(0xA11)))
		for i, got := range floats(rb) {
			assert.Equal(t, tt.want(send[i]), got, "op %d element %d", tt.op, i)
		}
		assert.Equal(t, uintptr(0xA11), f.lastStream())
	}

	// In place.
	buf := f32s(send...)
	require.NoError(t, n.AllReduce(ptr(buf), ptr(buf), uint64(len(send)), Float32, Sum, c, 0))
	assert.Equal(t, float32(4*3.5+2), floats(buf)[2])

	err := n.AllReduce(ptr(buf), ptr(buf), 1, Bfloat16, Sum, c, 0)
	require.ErrorIs(t, err, InvalidArgument)
	assert.Contains(t, err.Error(), "ncclAllReduce: ncclInvalidArgument")
	assert.Contains(t, err.Error(), "the stand-in reduces float32 only", "ncclGetLastError's detail is included")
}

func TestReduceScatter(t *testing.T) {
	n, _ := loadFake(t)
	const nranks, rank, per = 4, 2, 3
	c := initComm(t, n, nranks, rank)
	send := make([]float32, nranks*per)
	for i := range send {
		send[i] = float32(i) * 1.5
	}
	rb := make([]byte, 4*per)
	require.NoError(t, n.ReduceScatter(ptr(f32s(send...)), ptr(rb), per, Float32, Sum, c, 0))
	for i, got := range floats(rb) {
		x := send[rank*per+i]
		assert.Equal(t, 4*x+(-2-1+0+1), got, "element %d is from this rank's block", i)
	}
}

func TestAllGatherAndBroadcastUseElementSizes(t *testing.T) {
	n, f := loadFake(t)
	const nranks, rank = 3, 1
	c := initComm(t, n, nranks, rank)
	assert.Equal(t, peerByte(2, 1, 5), f.peerByteInLib(2, 1, 5), "the test's model of the stand-in")

	for _, dt := range []DataType{Int8, Bfloat16, Float32, Float64} {
		const count = 5
		chunk := count * dt.Size()
		send := make([]byte, chunk)
		for i := range send {
			send[i] = byte(200 + i)
		}
		recv := make([]byte, nranks*chunk)
		require.NoError(t, n.AllGather(ptr(send), ptr(recv), count, dt, c, 0))
		for p := 0; p < nranks; p++ {
			block := recv[uint64(p)*chunk : uint64(p+1)*chunk]
			for j := uint64(0); j < chunk; j++ {
				want := peerByte(p, rank, j)
				if p == rank {
					want = send[j]
				}
				require.Equal(t, want, block[j], "type %d block %d byte %d", dt, p, j)
			}
		}

		out := make([]byte, chunk)
		require.NoError(t, n.Broadcast(ptr(send), ptr(out), count, dt, rank, c, 0))
		assert.Equal(t, send, out, "root keeps its own data")
		require.NoError(t, n.Broadcast(ptr(send), ptr(out), count, dt, 2, c, 0))
		for j := uint64(0); j < chunk; j++ {
			require.Equal(t, peerByte(2, rank, j), out[j], "type %d byte %d from root 2", dt, j)
		}
	}
}

// checkAllToAll verifies an all-to-all on rank r of nranks: block p of recv
// came from peer p (this rank's own block p for itself), and block q of
// send went to peer q.
func checkAllToAll(t *testing.T, f *fakeLib, send, recv []byte, nranks, rank int, chunk uint64) {
	t.Helper()
	for p := 0; p < nranks; p++ {
		block := recv[uint64(p)*chunk : uint64(p+1)*chunk]
		for j := uint64(0); j < chunk; j++ {
			want := peerByte(p, rank, j)
			if p == rank {
				want = send[uint64(p)*chunk+j]
			}
			require.Equal(t, want, block[j], "block %d byte %d", p, j)
		}
		assert.Equal(t, int32(send[uint64(p)*chunk]), f.sentFirst(int32(p)), "block %d went to peer %d", p, p)
		assert.Equal(t, chunk, f.sentBytes(int32(p)))
	}
}

func TestAllToAllNative(t *testing.T) {
	n, f := loadFake(t)
	require.True(t, n.HasAllToAll())
	const nranks, rank, count = 4, 2, 6
	c := initComm(t, n, nranks, rank)
	chunk := count * Float32.Size()
	send := make([]byte, nranks*chunk)
	for i := range send {
		send[i] = byte(i*5 + 1)
	}
	recv := make([]byte, len(send))
	require.NoError(t, n.AllToAll(ptr(send), ptr(recv), count, Float32, c, driver.Stream(0x77)))
	assert.Equal(t, int32(1), f.nativeAll())
	assert.Equal(t, int32(0), f.sends())
	assert.Equal(t, uintptr(0x77), f.lastStream())
	checkAllToAll(t, f, send, recv, nranks, rank, chunk)
}

func TestAllToAllFallsBackToGroupedSendRecv(t *testing.T) {
	for _, dt := range []DataType{Bfloat16, Float32, Float64} {
		t.Run(map[DataType]string{Bfloat16: "bf16", Float32: "f32", Float64: "f64"}[dt], func(t *testing.T) {
			n, f := loadFake(t, "-DNO_ALLTOALL")
			require.False(t, n.HasAllToAll())
			const nranks, rank, count = 5, 3, 7
			c := initComm(t, n, nranks, rank)
			chunk := count * dt.Size()
			send := make([]byte, nranks*chunk)
			for i := range send {
				send[i] = byte(i*11 + 2)
			}
			recv := make([]byte, len(send))
			require.NoError(t, n.AllToAll(ptr(send), ptr(recv), count, dt, c, driver.Stream(0x99)))
			assert.Equal(t, int32(0), f.nativeAll())
			assert.Equal(t, int32(nranks), f.sends())
			assert.Equal(t, int32(nranks), f.recvs())
			assert.Equal(t, int32(0), f.groupDepth(), "the group is closed")
			assert.Equal(t, uintptr(0x99), f.lastStream())
			checkAllToAll(t, f, send, recv, nranks, rank, chunk)
		})
	}
}

func TestAllToAllRefusesUnknownTypes(t *testing.T) {
	n, f := loadFake(t, "-DNO_ALLTOALL")
	c := initComm(t, n, 2, 0)
	buf := make([]byte, 16)
	err := n.AllToAll(ptr(buf), ptr(buf), 1, DataType(42), c, 0)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "unknown data type 42")
	assert.Equal(t, int32(0), f.groupDepth())
}

func TestGroupedSendRecv(t *testing.T) {
	n, f := loadFake(t)
	const nranks, rank = 2, 0
	c := initComm(t, n, nranks, rank)
	out := f32s(1, 2, 3)
	self := make([]byte, len(out))
	fromPeer := make([]byte, len(out))
	require.NoError(t, n.GroupStart())
	require.NoError(t, n.Send(ptr(out), 3, Float32, 1, c, 0))
	require.NoError(t, n.Recv(ptr(fromPeer), 3, Float32, 1, c, 0))
	require.NoError(t, n.Send(ptr(out), 3, Float32, 0, c, 0))
	require.NoError(t, n.Recv(ptr(self), 3, Float32, 0, c, 0))
	assert.Equal(t, int32(1), f.groupDepth())
	assert.Equal(t, int32(0), f.sends(), "nothing runs before GroupEnd")
	require.NoError(t, n.GroupEnd())
	assert.Equal(t, out, self)
	for j := range fromPeer {
		assert.Equal(t, peerByte(1, rank, uint64(j)), fromPeer[j])
	}
	assert.Equal(t, uint64(12), f.sentBytes(1), "count is in elements of the data type")

	err := n.GroupEnd()
	require.ErrorIs(t, err, InvalidUsage)
	assert.Contains(t, err.Error(), "ncclGroupEnd: ncclInvalidUsage")

	err = n.Send(ptr(out), 3, Float32, 5, c, 0)
	require.ErrorIs(t, err, InvalidArgument)
	assert.Contains(t, err.Error(), "peer out of range")
}

func TestUniqueIDBytes(t *testing.T) {
	assert.Equal(t, uintptr(128), unsafe.Sizeof(UniqueID{}))
	_, err := UniqueIDFromBytes(make([]byte, 127))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "128")
	raw := make([]byte, 128)
	raw[5] = 9
	id, err := UniqueIDFromBytes(raw)
	require.NoError(t, err)
	raw[5] = 0
	b := id.Bytes()
	assert.Equal(t, byte(9), b[5], "the id keeps its own copy")
	b[5] = 1
	assert.Equal(t, byte(9), id.Bytes()[5])
}

// Values from nccl.h; they cross the ABI as plain ints.
func TestEnumValuesMatchNcclH(t *testing.T) {
	tests := []struct {
		name string
		got  int64
		want int64
	}{
		{"ncclSuccess", int64(Success), 0},
		{"ncclUnhandledCudaError", int64(UnhandledCudaError), 1},
		{"ncclSystemError", int64(SystemError), 2},
		{"ncclInternalError", int64(InternalError), 3},
		{"ncclInvalidArgument", int64(InvalidArgument), 4},
		{"ncclInvalidUsage", int64(InvalidUsage), 5},
		{"ncclRemoteError", int64(RemoteError), 6},
		{"ncclInProgress", int64(InProgress), 7},
		{"ncclInt8", int64(Int8), 0},
		{"ncclUint8", int64(Uint8), 1},
		{"ncclInt32", int64(Int32), 2},
		{"ncclUint32", int64(Uint32), 3},
		{"ncclInt64", int64(Int64), 4},
		{"ncclUint64", int64(Uint64), 5},
		{"ncclFloat16", int64(Float16), 6},
		{"ncclFloat32", int64(Float32), 7},
		{"ncclFloat64", int64(Float64), 8},
		{"ncclBfloat16", int64(Bfloat16), 9},
		{"ncclFloat8e4m3", int64(Float8e4m3), 10},
		{"ncclFloat8e5m2", int64(Float8e5m2), 11},
		{"ncclSum", int64(Sum), 0},
		{"ncclProd", int64(Prod), 1},
		{"ncclMax", int64(Max), 2},
		{"ncclMin", int64(Min), 3},
		{"ncclAvg", int64(Avg), 4},
		{"NCCL_UNIQUE_ID_BYTES", UniqueIDBytes, 128},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, tt.got, tt.name)
	}
	sizes := map[DataType]uint64{Int8: 1, Uint8: 1, Int32: 4, Uint32: 4, Int64: 8, Uint64: 8,
		Float16: 2, Float32: 4, Float64: 8, Bfloat16: 2, Float8e4m3: 1, Float8e5m2: 1, DataType(12): 0}
	for dt, want := range sizes {
		assert.Equal(t, want, dt.Size(), "size of type %d", dt)
	}
	assert.Equal(t, "ncclRemoteError", RemoteError.Error())
	assert.Equal(t, "ncclResult_t(99)", Result(99).Error())
}

func TestCommAbortAndAsyncError(t *testing.T) {
	n, f := loadFake(t)
	var aborted func() int64
	var setAsync func(r int32)
	require.NoError(t, n.lib.BindAll([]dl.Symbol{
		dl.Sym(&aborted, "fake_aborted_comms"),
		dl.Sym(&setAsync, "fake_set_async_error"),
	}))
	id, err := n.GetUniqueID()
	require.NoError(t, err)
	c, err := n.CommInitRank(2, id, 1)
	require.NoError(t, err)

	r, err := n.CommGetAsyncError(c)
	require.NoError(t, err)
	assert.Equal(t, Success, r)
	setAsync(int32(RemoteError))
	t.Cleanup(func() { setAsync(0) })
	r, err = n.CommGetAsyncError(c)
	require.NoError(t, err)
	assert.Equal(t, RemoteError, r, "the result arrives through the pointer")
	_, err = n.CommGetAsyncError(0)
	require.ErrorIs(t, err, InvalidArgument)

	require.NoError(t, n.CommAbort(c))
	assert.Equal(t, int64(1), aborted())
	assert.Equal(t, int64(0), f.liveComms())
}

func TestCommSplitIsOptional(t *testing.T) {
	n, _ := loadFake(t)
	require.False(t, n.HasCommSplit())
	require.False(t, n.HasCommInitRankScalable())
	c := initComm(t, n, 2, 0)
	_, err := n.CommSplit(c, 0, 0)
	require.ErrorIs(t, err, errors.ErrUnsupported)
	assert.Contains(t, err.Error(), "no ncclCommSplit (NCCL 2.18 or later has it)")
	id, err := n.GetUniqueID()
	require.NoError(t, err)
	_, err = n.CommInitRankScalable(2, 0, []UniqueID{id})
	require.ErrorIs(t, err, errors.ErrUnsupported)
}

func TestCommSplitPassesItsArguments(t *testing.T) {
	n, f := loadFake(t, "-DNEW_API")
	require.True(t, n.HasCommSplit())
	var color, key, nids, configNull func() int32
	require.NoError(t, n.lib.BindAll([]dl.Symbol{
		dl.Sym(&color, "fake_last_color"),
		dl.Sym(&key, "fake_last_key"),
		dl.Sym(&nids, "fake_last_nids"),
		dl.Sym(&configNull, "fake_last_config_is_null"),
	}))
	c := initComm(t, n, 4, 0)
	nc, err := n.CommSplit(c, 3, 2)
	require.NoError(t, err)
	assert.Equal(t, int32(3), color())
	assert.Equal(t, int32(2), key())
	assert.Equal(t, int32(1), configNull(), "the default configuration is a NULL ncclConfig_t*")
	rank, err := n.CommUserRank(nc)
	require.NoError(t, err)
	assert.Equal(t, 2, rank, "the new communicator came back through the pointer")
	require.NoError(t, n.CommDestroy(nc))

	nc, err = n.CommSplit(c, SplitNoColor, 0)
	require.NoError(t, err)
	assert.Equal(t, Comm(0), nc)
	assert.Equal(t, int32(-1), color())

	_, err = n.CommSplit(c, 1, 9)
	require.ErrorIs(t, err, InvalidArgument)
	assert.Contains(t, err.Error(), "split with color 1, key 9")

	// The ids travel by pointer; the stand-in records the last one's bytes.
	ids := make([]UniqueID, 3)
	for i := range ids {
		raw := make([]byte, UniqueIDBytes)
		for j := range raw {
			raw[j] = byte(i*50 + j)
		}
		ids[i], err = UniqueIDFromBytes(raw)
		require.NoError(t, err)
	}
	sc, err := n.CommInitRankScalable(4, 3, ids)
	require.NoError(t, err)
	t.Cleanup(func() { n.CommDestroy(sc) })
	assert.Equal(t, int32(3), nids())
	got := make([]byte, UniqueIDBytes)
	f.lastID(&got[0])
	assert.Equal(t, ids[2].Bytes(), got)
	assert.Equal(t, int32(3), f.lastRank())
	_, err = n.CommInitRankScalable(2, 0, nil)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "0 unique ids")
}
