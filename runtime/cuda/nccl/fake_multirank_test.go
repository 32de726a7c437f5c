package nccl_test

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/kernels/cpu"
	"gcompile/runtime/cuda/driver"
	"gcompile/runtime/cuda/fakegpu"
	"gcompile/runtime/cuda/nccl"
)

// These tests run communicators of several ranks on the fake GPU's NCCL
// (runtime/cuda/fakegpu): ranks on threads of this process, one device
// each, and ranks in child processes that re-run this test binary.

// fakeWorld is the fake GPU with its driver and NCCL loaded.
type fakeWorld struct {
	drv *driver.Driver
	lib *nccl.NCCL
}

// openFake installs the fake GPU with the given number of devices.
func openFake(t *testing.T, devices int) *fakeWorld {
	t.Helper()
	t.Setenv(fakegpu.DevicesEnv, strconv.Itoa(devices))
	fakegpu.Install(t)
	// A hang fails in seconds, not after the default two minutes.
	t.Setenv(fakegpu.NCCLTimeoutEnv, "20")
	drv, err := driver.Load()
	require.NoError(t, err)
	t.Cleanup(func() { drv.Close() })
	require.NoError(t, drv.Init())
	lib, err := nccl.Load()
	require.NoError(t, err)
	t.Cleanup(func() { lib.Close() })
	return &fakeWorld{drv: drv, lib: lib}
}

// onDevice runs body on a locked thread with device d's primary context
// current, as each rank of a multi-GPU program has. Memory allocated in
// body lives until the context's release.
func (w *fakeWorld) onDevice(d int, body func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	dev, err := w.drv.Device(d)
	if err != nil {
		return err
	}
	ctx, err := w.drv.PrimaryCtxRetain(dev)
	if err != nil {
		return err
	}
	defer w.drv.PrimaryCtxRelease(dev)
	if err := w.drv.SetCurrent(ctx); err != nil {
		return err
	}
	return body()
}

// ranks runs body for ranks 0…n-1 at once, rank r on device r.
func (w *fakeWorld) ranks(t *testing.T, n int, body func(r int) error) {
	t.Helper()
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[r] = w.onDevice(r, func() error { return body(r) })
		}()
	}
	wg.Wait()
	for r, err := range errs {
		require.NoError(t, err, "rank %d", r)
	}
}

// put copies b to new device memory of the current context.
func (w *fakeWorld) put(b []byte) (driver.DevicePtr, error) {
	p, err := w.drv.MemAlloc(uint64(max(len(b), 1)))
	if err != nil {
		return 0, err
	}
	if len(b) > 0 {
		err = w.drv.MemcpyHtoD(p, b)
	}
	return p, err
}

func (w *fakeWorld) get(p driver.DevicePtr, n int) ([]byte, error) {
	b := make([]byte, n)
	if n == 0 {
		return b, nil
	}
	return b, w.drv.MemcpyDtoH(b, p)
}

// elem is an element type the tests move through NCCL (uint16 holds the
// bits of fp16 and bf16).
type elem interface {
	~int8 | ~uint8 | ~int32 | ~uint16 | ~float32 | ~float64
}

func raw[T elem](x []T) []byte {
	if len(x) == 0 {
		return nil
	}
	var z T
	return bytes.Clone(unsafe.Slice((*byte)(unsafe.Pointer(&x[0])), len(x)*int(unsafe.Sizeof(z))))
}

// mix is a hash of (r, i, salt): inputs that differ per rank and element.
func mix(r, i, salt int) uint64 {
	h := uint64(r)*0x9e3779b97f4a7c15 ^ uint64(i)*0xbf58476d1ce4e5b9 ^ uint64(salt)*0x94d049bb133111eb
	h ^= h >> 31
	h *= 0xd6e8feb86659fd39
	return h ^ h>>29
}

// f32In spreads values over 30 binades, so sums depend on their order.
func f32In(r, i int) float32 {
	h := mix(r, i, 1)
	return float32(math.Ldexp(float64(h%1_000_000)/1_000_000-0.5, int(h>>40%30)-15))
}

func f64In(r, i int) float64 {
	h := mix(r, i, 2)
	return math.Ldexp(float64(h%1_000_000_007)/1_000_000_007-0.5, int(h>>40%60)-30)
}

// half16In draws finite fp16 (bf16 false) or bf16 bits of moderate size.
func half16In(r, i int, bf16 bool) uint16 {
	h := mix(r, i, 3)
	sign := uint16(h>>63) << 15
	if bf16 {
		return sign | uint16(120+h%16)<<7 | uint16(h>>8)&0x7f
	}
	return sign | uint16(8+h%16)<<10 | uint16(h>>8)&0x3ff
}

func gen[T elem](n int, f func(i int) T) []T {
	out := make([]T, n)
	for i := range out {
		out[i] = f(i)
	}
	return out
}

// fold reduces the ranks' inputs elementwise in rank order: in(0) op
// in(1) op in(2) …, the order every gcompile transport sums in.
func fold[T elem](nranks, count int, in func(r, i int) T, op func(a, b T) T) []T {
	out := gen(count, func(i int) T { return in(0, i) })
	for r := 1; r < nranks; r++ {
		for i := range out {
			out[i] = op(out[i], in(r, i))
		}
	}
	return out
}

func add[T elem](a, b T) T { return a + b }

func add16(bf16 bool) func(a, b uint16) uint16 {
	if bf16 {
		return func(a, b uint16) uint16 { return cpu.BF16FromF32(cpu.F32FromBF16(a) + cpu.F32FromBF16(b)) }
	}
	return func(a, b uint16) uint16 { return cpu.F16FromF32(cpu.F32FromF16(a) + cpu.F32FromF16(b)) }
}

// collCase is one collective run on every rank, with the bytes each rank
// must get.
type collCase struct {
	name string
	run  func(w *fakeWorld, c nccl.Comm, r int) ([]byte, error)
	want func(r int) []byte
}

// runColl uploads in, runs call with send and receive buffers (out bytes)
// and downloads the result.
func runColl(w *fakeWorld, in []byte, out int, call func(send, recv driver.DevicePtr) error) ([]byte, error) {
	send, err := w.put(in)
	if err != nil {
		return nil, err
	}
	recv, err := w.put(make([]byte, out))
	if err != nil {
		return nil, err
	}
	if err := call(send, recv); err != nil {
		return nil, err
	}
	return w.get(recv, out)
}

func allReduceCase[T elem](name string, nranks, count int, dt nccl.DataType, op nccl.RedOp, in func(r, i int) T, ref func(a, b T) T, post func(T) T) collCase {
	return collCase{
		name: name,
		run: func(w *fakeWorld, c nccl.Comm, r int) ([]byte, error) {
			b := raw(gen(count, func(i int) T { return in(r, i) }))
			return runColl(w, b, len(b), func(s, d driver.DevicePtr) error {
				return w.lib.AllReduce(s, d, uint64(count), dt, op, c, 0)
			})
		},
		want: func(int) []byte {
			out := fold(nranks, count, in, ref)
			if post != nil {
				for i := range out {
					out[i] = post(out[i])
				}
			}
			return raw(out)
		},
	}
}

// collectiveCases covers every collective, the reductions and the element
// types, on a world of nranks.
func collectiveCases(nranks int) []collCase {
	const count = 37
	n := nranks
	i32 := func(r, i int) int32 { return int32(mix(r, i, 4)) } // sums overflow and wrap
	u8 := func(r, i int) uint8 { return uint8(mix(r, i, 5)) }
	i8 := func(r, i int) int8 { return int8(mix(r, i, 6)) }
	f16 := func(r, i int) uint16 { return half16In(r, i, false) }
	bf16 := func(r, i int) uint16 { return half16In(r, i, true) }
	cases := []collCase{
		allReduceCase("all-reduce f32 sum", n, count, nccl.Float32, nccl.Sum, f32In, add[float32], nil),
		allReduceCase("all-reduce f32 prod", n, count, nccl.Float32, nccl.Prod, f32In,
			func(a, b float32) float32 { return a * b }, nil),
		allReduceCase("all-reduce f32 max", n, count, nccl.Float32, nccl.Max, f32In,
			func(a, b float32) float32 { return max(a, b) }, nil),
		allReduceCase("all-reduce f32 min", n, count, nccl.Float32, nccl.Min, f32In,
			func(a, b float32) float32 { return min(a, b) }, nil),
		allReduceCase("all-reduce f32 avg", n, count, nccl.Float32, nccl.Avg, f32In, add[float32],
			func(s float32) float32 { return s / float32(n) }),
		allReduceCase("all-reduce f64 sum", n, count, nccl.Float64, nccl.Sum, f64In, add[float64], nil),
		allReduceCase("all-reduce i32 sum", n, count, nccl.Int32, nccl.Sum, i32, add[int32], nil),
		allReduceCase("all-reduce u8 sum", n, count, nccl.Uint8, nccl.Sum, u8, add[uint8], nil),
		allReduceCase("all-reduce i8 max", n, count, nccl.Int8, nccl.Max, i8,
			func(a, b int8) int8 { return max(a, b) }, nil),
		allReduceCase("all-reduce f16 sum", n, count, nccl.Float16, nccl.Sum, f16, add16(false), nil),
		allReduceCase("all-reduce bf16 sum", n, count, nccl.Bfloat16, nccl.Sum, bf16, add16(true), nil),
		{
			name: "reduce-scatter f32 sum",
			run: func(w *fakeWorld, c nccl.Comm, r int) ([]byte, error) {
				in := raw(gen(n*count, func(i int) float32 { return f32In(r, i) }))
				return runColl(w, in, 4*count, func(s, d driver.DevicePtr) error {
					return w.lib.ReduceScatter(s, d, count, nccl.Float32, nccl.Sum, c, 0)
				})
			},
			want: func(r int) []byte {
				return raw(fold(n, count, func(p, i int) float32 { return f32In(p, r*count+i) }, add[float32]))
			},
		},
		{
			name: "all-gather i32",
			run: func(w *fakeWorld, c nccl.Comm, r int) ([]byte, error) {
				in := raw(gen(count, func(i int) int32 { return i32(r, i) }))
				return runColl(w, in, 4*n*count, func(s, d driver.DevicePtr) error {
					return w.lib.AllGather(s, d, count, nccl.Int32, c, 0)
				})
			},
			want: func(int) []byte {
				return raw(gen(n*count, func(i int) int32 { return i32(i/count, i%count) }))
			},
		},
		{
			name: "broadcast f64 from the last rank",
			run: func(w *fakeWorld, c nccl.Comm, r int) ([]byte, error) {
				in := raw(gen(count, func(i int) float64 { return f64In(r, i) }))
				return runColl(w, in, 8*count, func(s, d driver.DevicePtr) error {
					return w.lib.Broadcast(s, d, count, nccl.Float64, n-1, c, 0)
				})
			},
			want: func(int) []byte { return raw(gen(count, func(i int) float64 { return f64In(n-1, i) })) },
		},
		{
			name: "all-to-all f32",
			run: func(w *fakeWorld, c nccl.Comm, r int) ([]byte, error) {
				in := raw(gen(n*count, func(i int) float32 { return f32In(r, i) }))
				return runColl(w, in, len(in), func(s, d driver.DevicePtr) error {
					return w.lib.AllToAll(s, d, count, nccl.Float32, c, 0)
				})
			},
			// Block p comes from rank p, which sent its block r.
			want: func(r int) []byte {
				return raw(gen(n*count, func(i int) float32 { return f32In(i/count, r*count+i%count) }))
			},
		},
		{
			name: "all-reduce in place",
			run: func(w *fakeWorld, c nccl.Comm, r int) ([]byte, error) {
				buf, err := w.put(raw(gen(count, func(i int) float32 { return f32In(r, i) })))
				if err != nil {
					return nil, err
				}
				if err := w.lib.AllReduce(buf, buf, count, nccl.Float32, nccl.Sum, c, 0); err != nil {
					return nil, err
				}
				return w.get(buf, 4*count)
			},
			want: func(int) []byte { return raw(fold(n, count, f32In, add[float32])) },
		},
	}
	return cases
}

// checkCollectives runs every case on rank r of c and reports each result
// that differs from what NCCL defines.
func checkCollectives(w *fakeWorld, c nccl.Comm, nranks, r int) error {
	var errs []error
	for _, tc := range collectiveCases(nranks) {
		got, err := tc.run(w, c, r)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", tc.name, err))
			continue
		}
		if want := tc.want(r); !bytes.Equal(got, want) {
			errs = append(errs, fmt.Errorf("%s: rank %d got % x, want % x", tc.name, r, got, want))
		}
	}
	return errors.Join(errs...)
}

// The test data is worth something only if the order of the sum shows.
func TestFakeInputsMakeSumOrderVisible(t *testing.T) {
	const n, count = 4, 37
	fwd := fold(n, count, f32In, add[float32])
	rev := fold(n, count, func(r, i int) float32 { return f32In(n-1-r, i) }, add[float32])
	assert.NotEqual(t, raw(fwd), raw(rev))
}

func TestFakeCollectivesAcrossFourThreads(t *testing.T) {
	const n = 4
	w := openFake(t, n)
	id, err := w.lib.GetUniqueID()
	require.NoError(t, err)
	w.ranks(t, n, func(r int) error {
		c, err := w.lib.CommInitRank(n, id, r)
		if err != nil {
			return err
		}
		defer w.lib.CommDestroy(c)
		count, err := w.lib.CommCount(c)
		if err != nil {
			return err
		}
		rank, err := w.lib.CommUserRank(c)
		if err != nil {
			return err
		}
		if count != n || rank != r {
			return fmt.Errorf("rank %d of %d reports rank %d of %d", r, n, rank, count)
		}
		return checkCollectives(w, c, n, r)
	})
}

func f32s(x ...float32) []byte { return raw(x) }

func TestFakeSendRecvPairInOrder(t *testing.T) {
	const n, count = 3, 5
	w := openFake(t, n)
	id, err := w.lib.GetUniqueID()
	require.NoError(t, err)
	lib := w.lib
	msg := func(from, k int) []byte {
		return raw(gen(count, func(i int) float32 { return float32(from*100 + k*10 + i) }))
	}
	w.ranks(t, n, func(r int) error {
		c, err := lib.CommInitRank(n, id, r)
		if err != nil {
			return err
		}
		defer lib.CommDestroy(c)
		next, prev := (r+1)%n, (r+n-1)%n
		recv, err := w.put(make([]byte, 8*count))
		if err != nil {
			return err
		}

		// Sends are buffered, so three sends before any receive complete;
		// the receives take them in order.
		for k := range 3 {
			p, err := w.put(msg(r, k))
			if err != nil {
				return err
			}
			if err := lib.Send(p, count, nccl.Float32, next, c, 0); err != nil {
				return fmt.Errorf("send %d: %w", k, err)
			}
		}
		for k := range 3 {
			if err := lib.Recv(recv, count, nccl.Float32, prev, c, 0); err != nil {
				return fmt.Errorf("receive %d: %w", k, err)
			}
			got, err := w.get(recv, 4*count)
			if err != nil {
				return err
			}
			assert.Equal(t, msg(prev, k), got, "rank %d's receive %d from rank %d", r, k, prev)
		}

		// A ring inside a group, with a send to self that pairs up locally.
		out, err := w.put(msg(r, 7))
		if err != nil {
			return err
		}
		self, err := w.put(make([]byte, 4*count))
		if err != nil {
			return err
		}
		if err := lib.GroupStart(); err != nil {
			return err
		}
		errs := []error{
			lib.Recv(recv, count, nccl.Float32, prev, c, 0),
			lib.Send(out, count, nccl.Float32, next, c, 0),
			lib.Recv(self, count, nccl.Float32, r, c, 0),
			lib.Send(out, count, nccl.Float32, r, c, 0),
			lib.GroupEnd(),
		}
		if err := errors.Join(errs...); err != nil {
			return fmt.Errorf("ring: %w", err)
		}
		got, err := w.get(recv, 4*count)
		if err != nil {
			return err
		}
		assert.Equal(t, msg(prev, 7), got, "ring on rank %d", r)
		got, err = w.get(self, 4*count)
		if err != nil {
			return err
		}
		assert.Equal(t, msg(r, 7), got, "send to self on rank %d", r)

		// With more than one rank a send to self outside a group is still
		// an error: on a GPU it would wait forever.
		err = lib.Send(out, count, nccl.Float32, r, c, 0)
		assert.ErrorIs(t, err, nccl.InvalidUsage)
		assert.ErrorContains(t, err, "outside ncclGroupStart/ncclGroupEnd never completes")

		// A receive that does not match its send fails on the receiver;
		// the pairing stays in step for the next pair.
		switch r {
		case 0:
			for _, cnt := range []uint64{4, count} {
				if err := lib.Send(out, cnt, nccl.Float32, 1, c, 0); err != nil {
					return err
				}
			}
		case 1:
			err := lib.Recv(recv, 2*count, nccl.Int32, 0, c, 0)
			assert.ErrorIs(t, err, nccl.InvalidUsage)
			assert.ErrorContains(t, err, "ncclRecv on rank 1 expects 10 x ncclInt32 from rank 0, but the ncclSend it "+
				"pairs with (#5 from rank 0 to rank 1) has 4 x ncclFloat32")
			if err := lib.Recv(recv, count, nccl.Float32, 0, c, 0); err != nil {
				return fmt.Errorf("the pair after a mismatch: %w", err)
			}
			got, err := w.get(recv, 4*count)
			if err != nil {
				return err
			}
			assert.Equal(t, msg(0, 7), got)
		}
		return nil
	})
}

func TestFakeMismatchedCallsFailOnEveryRank(t *testing.T) {
	const n = 2
	w := openFake(t, n)
	id, err := w.lib.GetUniqueID()
	require.NoError(t, err)
	lib := w.lib
	w.ranks(t, n, func(r int) error {
		c, err := lib.CommInitRank(n, id, r)
		if err != nil {
			return err
		}
		defer lib.CommDestroy(c)
		buf, err := w.put(make([]byte, 64))
		if err != nil {
			return err
		}
		expect := func(err error, code nccl.Result, text string) {
			t.Helper()
			assert.ErrorIs(t, err, code, "rank %d", r)
			assert.ErrorContains(t, err, text, "rank %d", r)
		}

		err = lib.AllReduce(buf, buf, uint64(4+r), nccl.Float32, nccl.Sum, c, 0)
		expect(err, nccl.InvalidUsage, "collective #1 does not match across ranks: rank 0 called "+
			"ncclAllReduce(count 4, ncclFloat32, ncclSum); rank 1 called ncclAllReduce(count 5, ncclFloat32, ncclSum) "+
			"(count differs)")

		if r == 0 {
			err = lib.AllReduce(buf, buf, 2, nccl.Float32, nccl.Max, c, 0)
		} else {
			err = lib.AllGather(buf, buf, 2, nccl.Float32, c, 0)
		}
		expect(err, nccl.InvalidUsage, "rank 1 called ncclAllGather(count 2, ncclFloat32) (collective differs)")

		err = lib.Broadcast(buf, buf, 2, nccl.Int32, r, c, 0)
		expect(err, nccl.InvalidUsage, "rank 1 called ncclBroadcast(count 2, ncclInt32, root 1) (root differs)")

		types, ops := []nccl.DataType{nccl.Float32, nccl.Int32}, []nccl.RedOp{nccl.Sum, nccl.Max}
		err = lib.ReduceScatter(buf, buf, 2, types[r], ops[r], c, 0)
		expect(err, nccl.InvalidUsage, "collective #4 does not match across ranks: rank 0 called "+
			"ncclReduceScatter(count 2, ncclFloat32, ncclSum); rank 1 called ncclReduceScatter(count 2, ncclInt32, "+
			"ncclMax) (data type, reduction differs)")

		err = lib.AllReduce(buf, buf, 3, nccl.DataType(r*42+7), nccl.Sum, c, 0)
		if r == 1 {
			expect(err, nccl.InvalidArgument, "ncclAllReduce: unknown data type 49")
		} else {
			expect(err, nccl.InvalidUsage, "rank 1's ncclAllReduce (collective #5) failed: unknown data type 49")
		}

		// A buffer that ends inside its allocation on one rank only.
		err = lib.AllReduce(buf, buf, uint64(16+r), nccl.Float32, nccl.Sum, c, 0)
		if r == 1 {
			expect(err, nccl.InvalidArgument, "runs 4 bytes past the end of its 64-byte allocation")
		} else {
			expect(err, nccl.InvalidUsage, "rank 1's ncclAllReduce (collective #6) failed: send buffer")
		}

		// The ranks are still in step.
		in, err := w.put(f32s(1.5, float32(r)))
		if err != nil {
			return err
		}
		if err := lib.AllReduce(in, in, 2, nccl.Float32, nccl.Sum, c, 0); err != nil {
			return err
		}
		got, err := w.get(in, 8)
		if err != nil {
			return err
		}
		assert.Equal(t, f32s(3, 1), got)
		return nil
	})
}

func TestFakeAbortWakesABlockedReceive(t *testing.T) {
	const n = 2
	w := openFake(t, n)
	id, err := w.lib.GetUniqueID()
	require.NoError(t, err)
	lib := w.lib
	aborted := make(chan struct{})
	w.ranks(t, n, func(r int) error {
		c, err := lib.CommInitRank(n, id, r)
		if err != nil {
			return err
		}
		if r == 0 {
			defer lib.CommDestroy(c)
			<-aborted
			// The peer's abort reaches this rank without a call of its own.
			deadline := time.Now().Add(5 * time.Second)
			for {
				res, err := lib.CommGetAsyncError(c)
				if err != nil {
					return err
				}
				if res != nccl.Success || time.Now().After(deadline) {
					assert.Equal(t, nccl.RemoteError, res)
					break
				}
				time.Sleep(5 * time.Millisecond)
			}
			buf, err := w.put(make([]byte, 16))
			if err != nil {
				return err
			}
			err = lib.AllReduce(buf, buf, 4, nccl.Float32, nccl.Sum, c, 0)
			assert.ErrorIs(t, err, nccl.RemoteError)
			assert.ErrorContains(t, err, "rank 1 called ncclCommAbort")
			return nil
		}
		defer close(aborted)
		buf, err := w.put(make([]byte, 16))
		if err != nil {
			return err
		}
		done := make(chan error, 1)
		go func() {
			time.Sleep(100 * time.Millisecond)
			done <- lib.CommAbort(c)
		}()
		start := time.Now()
		err = lib.Recv(buf, 4, nccl.Float32, 0, c, 0) // rank 0 never sends
		assert.Less(t, time.Since(start), 5*time.Second)
		assert.ErrorIs(t, err, nccl.SystemError)
		assert.ErrorContains(t, err, "aborted: ncclCommAbort was called on rank 1's communicator while it waited "+
			"for a send from rank 0")
		if err := <-done; err != nil {
			return fmt.Errorf("abort: %w", err)
		}
		_, err = lib.CommCount(c)
		assert.ErrorContains(t, err, "is not a live communicator", "the abort freed the communicator")
		return nil
	})
}

func TestFakeCommSplit(t *testing.T) {
	const n = 4
	w := openFake(t, n)
	id, err := w.lib.GetUniqueID()
	require.NoError(t, err)
	lib := w.lib
	require.True(t, lib.HasCommSplit())
	// Ranks 0 and 2 form one communicator, ordered by key (so rank 2
	// first); rank 1 forms one alone; rank 3 joins none.
	colors := []int{0, 1, 0, nccl.SplitNoColor}
	wantRank := []int{1, 0, 0, -1}
	wantSize := []int{2, 1, 2, 0}
	w.ranks(t, n, func(r int) error {
		c, err := lib.CommInitRank(n, id, r)
		if err != nil {
			return err
		}
		defer lib.CommDestroy(c)
		sub, err := lib.CommSplit(c, colors[r], -r)
		if err != nil {
			return err
		}
		if colors[r] == nccl.SplitNoColor {
			assert.Equal(t, nccl.Comm(0), sub)
		} else {
			defer lib.CommDestroy(sub)
			size, err := lib.CommCount(sub)
			if err != nil {
				return err
			}
			rank, err := lib.CommUserRank(sub)
			if err != nil {
				return err
			}
			assert.Equal(t, wantSize[r], size, "rank %d's new size", r)
			assert.Equal(t, wantRank[r], rank, "rank %d's new rank", r)
			in, err := w.put(f32s(float32(r), 1))
			if err != nil {
				return err
			}
			if err := lib.AllReduce(in, in, 2, nccl.Float32, nccl.Sum, sub, 0); err != nil {
				return err
			}
			got, err := w.get(in, 8)
			if err != nil {
				return err
			}
			want := map[int][]byte{0: f32s(2, 2), 1: f32s(1, 1), 2: f32s(2, 2)}[r]
			assert.Equal(t, want, got, "sum over rank %d's new communicator", r)
		}
		// The parent still works after the split.
		in, err := w.put(f32s(1))
		if err != nil {
			return err
		}
		if err := lib.AllReduce(in, in, 1, nccl.Float32, nccl.Sum, c, 0); err != nil {
			return err
		}
		got, err := w.get(in, 4)
		if err != nil {
			return err
		}
		assert.Equal(t, f32s(n), got)
		return nil
	})
}

func TestFakeCommInitRankScalable(t *testing.T) {
	const n = 3
	w := openFake(t, n)
	require.True(t, w.lib.HasCommInitRankScalable())
	ids := make([]nccl.UniqueID, 2)
	for i := range ids {
		var err error
		ids[i], err = w.lib.GetUniqueID()
		require.NoError(t, err)
	}
	w.ranks(t, n, func(r int) error {
		c, err := w.lib.CommInitRankScalable(n, r, ids)
		if err != nil {
			return err
		}
		defer w.lib.CommDestroy(c)
		in, err := w.put(f32s(float32(r)))
		if err != nil {
			return err
		}
		if err := w.lib.AllReduce(in, in, 1, nccl.Float32, nccl.Sum, c, 0); err != nil {
			return err
		}
		got, err := w.get(in, 4)
		if err != nil {
			return err
		}
		assert.Equal(t, f32s(3), got)
		return nil
	})
}

// A rank that leaves with ncclCommDestroy fails only what needs it: its
// buffered sends are still received, and collectives fail at once.
func TestFakeDestroyedRankFailsOnlyWhatNeedsIt(t *testing.T) {
	const n = 2
	w := openFake(t, n)
	id, err := w.lib.GetUniqueID()
	require.NoError(t, err)
	lib := w.lib
	left := make(chan struct{})
	w.ranks(t, n, func(r int) error {
		c, err := lib.CommInitRank(n, id, r)
		if err != nil {
			return err
		}
		buf, err := w.put(f32s(4, 2))
		if err != nil {
			return err
		}
		if r == 0 {
			defer close(left)
			if err := lib.Send(buf, 2, nccl.Float32, 1, c, 0); err != nil {
				return err
			}
			return lib.CommDestroy(c)
		}
		defer lib.CommDestroy(c)
		<-left
		out, err := w.put(make([]byte, 8))
		if err != nil {
			return err
		}
		if err := lib.Recv(out, 2, nccl.Float32, 0, c, 0); err != nil {
			return fmt.Errorf("the departed rank's buffered send: %w", err)
		}
		got, err := w.get(out, 8)
		if err != nil {
			return err
		}
		assert.Equal(t, f32s(4, 2), got)
		err = lib.Recv(out, 2, nccl.Float32, 0, c, 0)
		assert.ErrorIs(t, err, nccl.RemoteError)
		assert.ErrorContains(t, err, "rank 0 destroyed its communicator; no send from it is left for rank 1's ncclRecv")
		err = lib.AllReduce(buf, buf, 2, nccl.Float32, nccl.Sum, c, 0)
		assert.ErrorIs(t, err, nccl.RemoteError)
		assert.ErrorContains(t, err, "rank 0 destroyed its communicator before it joined collective #1")
		res, err := lib.CommGetAsyncError(c)
		if err != nil {
			return err
		}
		assert.Equal(t, nccl.Success, res, "a rank that left on purpose is no asynchronous error")
		return nil
	})
}

// One thread drives the ranks of two devices, as NCCL's single-thread
// multi-GPU pattern (and gcompile's CUDA backend) does: everything that
// involves both ranks goes inside one group.
func TestFakeOneThreadDrivesTwoDevices(t *testing.T) {
	w := openFake(t, 2)
	lib, drv := w.lib, w.drv
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	ctx := make([]driver.Context, 2)
	for d := range 2 {
		dev, err := drv.Device(d)
		require.NoError(t, err)
		ctx[d], err = drv.PrimaryCtxRetain(dev)
		require.NoError(t, err)
		t.Cleanup(func() { drv.PrimaryCtxRelease(dev) })
	}

	initBoth := func(t *testing.T, devs [2]int) ([2]nccl.Comm, error) {
		id, err := lib.GetUniqueID()
		require.NoError(t, err)
		var comms [2]nccl.Comm
		require.NoError(t, lib.GroupStart())
		for r := range 2 {
			require.NoError(t, drv.SetCurrent(ctx[devs[r]]))
			comms[r], err = lib.CommInitRank(2, id, r)
			require.NoError(t, err, "inside a group the call only queues")
		}
		return comms, lib.GroupEnd()
	}

	t.Run("two ranks on one device", func(t *testing.T) {
		// Groups and current contexts are per thread.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		comms, err := initBoth(t, [2]int{1, 1})
		require.ErrorIs(t, err, nccl.InvalidUsage)
		assert.ErrorContains(t, err, "Duplicate GPU detected: rank 0 and rank 1 both on device 1 of process")
		for _, c := range comms {
			require.NoError(t, lib.CommDestroy(c))
		}
	})

	comms, err := initBoth(t, [2]int{0, 1})
	require.NoError(t, err)
	bufs := make([]driver.DevicePtr, 2)
	for r := range 2 {
		require.NoError(t, drv.SetCurrent(ctx[r]))
		bufs[r], err = w.put(f32s(float32(r+1), 10))
		require.NoError(t, err)
	}
	require.NoError(t, lib.GroupStart())
	for r := range 2 {
		require.NoError(t, lib.AllReduce(bufs[r], bufs[r], 2, nccl.Float32, nccl.Sum, comms[r], 0))
	}
	require.NoError(t, lib.GroupEnd())
	for r := range 2 {
		require.NoError(t, drv.SetCurrent(ctx[r]))
		got, err := w.get(bufs[r], 8)
		require.NoError(t, err)
		assert.Equal(t, f32s(3, 20), got, "rank %d", r)
	}

	// A buffer of the other device is refused, as NCCL_CHECK_POINTERS=1
	// refuses it.
	require.NoError(t, lib.GroupStart())
	require.NoError(t, lib.AllReduce(bufs[0], bufs[0], 2, nccl.Float32, nccl.Sum, comms[0], 0))
	err = lib.AllReduce(bufs[0], bufs[0], 2, nccl.Float32, nccl.Sum, comms[1], 0)
	assert.ErrorIs(t, err, nccl.InvalidArgument)
	assert.ErrorContains(t, err, "is memory of device 0, but the rank uses device 1")
	err = lib.GroupEnd()
	assert.ErrorIs(t, err, nccl.InvalidUsage, "rank 0 hears why its partner is missing")
	assert.ErrorContains(t, err, "rank 1's ncclAllReduce (collective #2) failed")

	// Splitting both ranks from this thread takes a group too; the new
	// communicators are usable after its ncclGroupEnd.
	var subs [2]nccl.Comm
	require.NoError(t, lib.GroupStart())
	for r := range 2 {
		subs[r], err = lib.CommSplit(comms[r], 7, 1-r)
		require.NoError(t, err)
		require.NotZero(t, subs[r])
	}
	require.NoError(t, lib.GroupEnd())
	for r := range 2 {
		require.NoError(t, drv.SetCurrent(ctx[r]))
		require.NoError(t, drv.MemcpyHtoD(bufs[r], f32s(float32(r+1), float32(10*(r+1)))))
	}
	require.NoError(t, lib.GroupStart())
	for r := range 2 {
		require.NoError(t, drv.SetCurrent(ctx[r]))
		require.NoError(t, lib.Broadcast(bufs[r], bufs[r], 2, nccl.Float32, 0, subs[r], 0))
	}
	require.NoError(t, lib.GroupEnd())
	for r := range 2 {
		rank, err := lib.CommUserRank(subs[r])
		require.NoError(t, err)
		assert.Equal(t, 1-r, rank, "keys reverse the order")
		require.NoError(t, drv.SetCurrent(ctx[r]))
		got, err := w.get(bufs[r], 8)
		require.NoError(t, err)
		assert.Equal(t, f32s(2, 20), got, "rank %d has the new rank 0's (old rank 1's) data", r)
		require.NoError(t, lib.CommDestroy(subs[r]))
	}

	// Outside a group the thread would wait for itself: the safety net
	// ends the wait, and the communicator is unusable after it.
	t.Setenv(fakegpu.NCCLTimeoutEnv, "0.3")
	start := time.Now()
	err = lib.AllReduce(bufs[0], bufs[0], 2, nccl.Float32, nccl.Sum, comms[0], 0)
	assert.Less(t, time.Since(start), 3*time.Second)
	require.ErrorIs(t, err, nccl.SystemError)
	assert.ErrorContains(t, err, "rank 0 timed out after 0.3 s waiting for every rank to call ncclAllReduce (count 2, "+
		"ncclFloat32)")
	res, err := lib.CommGetAsyncError(comms[0])
	require.NoError(t, err)
	assert.Equal(t, nccl.SystemError, res)
	for _, c := range comms {
		require.NoError(t, lib.CommDestroy(c))
	}
}

// Cross-process tests: the parent makes the id, and children (this test
// binary again, running TestFakeChildProcess) are the ranks.

const (
	childRoleEnv   = "GCOMPILE_NCCL_TEST_ROLE"
	childIDEnv     = "GCOMPILE_NCCL_TEST_ID"
	childNranksEnv = "GCOMPILE_NCCL_TEST_NRANKS"
	childRankEnv   = "GCOMPILE_NCCL_TEST_RANK"
	childOpEnv     = "GCOMPILE_NCCL_TEST_OP"
)

// lineWriter passes a child's output on line by line.
type lineWriter struct {
	mu    sync.Mutex
	part  []byte
	all   bytes.Buffer
	lines chan string
}

func (l *lineWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.all.Write(b)
	l.part = append(l.part, b...)
	for {
		i := bytes.IndexByte(l.part, '\n')
		if i < 0 {
			return len(b), nil
		}
		select {
		case l.lines <- string(l.part[:i]):
		default: // nobody needs lines beyond the channel's room
		}
		l.part = l.part[i+1:]
	}
}

func (l *lineWriter) output() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.all.String()
}

type child struct {
	rank int
	cmd  *exec.Cmd
	out  *lineWriter
	done chan error
}

// startChild runs rank of an nranks-wide communicator in a new process,
// using device rank of its own fake GPU.
func startChild(t *testing.T, role string, id nccl.UniqueID, nranks, rank int, env ...string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestFakeChildProcess$", "-test.v")
	cmd.Env = append(os.Environ(),
		childRoleEnv+"="+role,
		childIDEnv+"="+hex.EncodeToString(id.Bytes()),
		childNranksEnv+"="+strconv.Itoa(nranks),
		childRankEnv+"="+strconv.Itoa(rank),
		fakegpu.DevicesEnv+"="+strconv.Itoa(nranks),
		// A failure to notice a dead peer shows as this timeout.
		fakegpu.NCCLTimeoutEnv+"=15",
	)
	cmd.Env = append(cmd.Env, env...)
	out := &lineWriter{lines: make(chan string, 64)}
	cmd.Stdout, cmd.Stderr = out, out
	require.NoError(t, cmd.Start())
	c := &child{rank: rank, cmd: cmd, out: out, done: make(chan error, 1)}
	go func() { c.done <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-c.done
		if t.Failed() {
			t.Logf("rank %d's output:\n%s", rank, out.output())
		}
	})
	return c
}

// expect waits for a line starting with prefix and returns it.
func (c *child) expect(t *testing.T, prefix string, timeout time.Duration) string {
	t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case l := <-c.out.lines:
			if strings.HasPrefix(l, prefix) {
				return l
			}
		case err := <-c.done:
			c.done <- err
			// The output is complete once the process is waited for.
			for {
				select {
				case l := <-c.out.lines:
					if strings.HasPrefix(l, prefix) {
						return l
					}
					continue
				default:
				}
				break
			}
			t.Fatalf("rank %d exited (%v) before printing %q", c.rank, err, prefix)
		case <-deadline:
			t.Fatalf("rank %d printed no %q within %v", c.rank, prefix, timeout)
		}
	}
}

func (c *child) wait(t *testing.T, timeout time.Duration) {
	t.Helper()
	select {
	case err := <-c.done:
		c.done <- err
		require.NoError(t, err, "rank %d", c.rank)
	case <-time.After(timeout):
		t.Fatalf("rank %d did not finish within %v", c.rank, timeout)
	}
}

// parentID installs the fake for the children and makes their id here;
// this process joins no communicator.
func parentID(t *testing.T) nccl.UniqueID {
	t.Helper()
	fakegpu.Install(t)
	lib, err := nccl.Load()
	require.NoError(t, err)
	t.Cleanup(func() { lib.Close() })
	id, err := lib.GetUniqueID()
	require.NoError(t, err)
	return id
}

func TestFakeCollectivesAcrossProcesses(t *testing.T) {
	for _, n := range []int{2, 4} {
		t.Run(strconv.Itoa(n), func(t *testing.T) {
			id := parentID(t)
			children := make([]*child, n)
			for r := range n {
				children[r] = startChild(t, "collectives", id, n, r)
			}
			for _, c := range children {
				c.wait(t, 60*time.Second)
			}
		})
	}
}

// A rank whose peer process is killed while it waits gets RemoteError at
// once, whether the dead process hosted the communicator's hub (rank 0)
// or not.
func TestFakePeerDeathEndsTheWait(t *testing.T) {
	for _, tc := range []struct {
		name           string
		victim, waiter int
		op             string
		why            string
	}{
		{"rank 1 dies during an all-reduce", 1, 0, "allreduce", "rank 1 (process"},
		{"rank 0 dies during a receive", 0, 1, "recv", "lost the connection to the communicator's hub"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := parentID(t)
			kids := map[int]*child{}
			kids[tc.victim] = startChild(t, "victim", id, 2, tc.victim)
			kids[tc.waiter] = startChild(t, "waiter", id, 2, tc.waiter, childOpEnv+"="+tc.op)
			victim, waiter := kids[tc.victim], kids[tc.waiter]
			victim.expect(t, "ready", 30*time.Second)
			waiter.expect(t, "blocking", 30*time.Second)
			time.Sleep(200 * time.Millisecond) // let the call block
			require.NoError(t, victim.cmd.Process.Kill())
			killed := time.Now()
			line := waiter.expect(t, "result ", 10*time.Second)
			assert.Less(t, time.Since(killed), 5*time.Second, "noticed long after the kill")
			assert.True(t, strings.HasPrefix(line, "result ncclRemoteError "), "%s", line)
			assert.Contains(t, line, tc.why)
			assert.Equal(t, "async ncclRemoteError", waiter.expect(t, "async ", 5*time.Second))
			waiter.wait(t, 10*time.Second)
		})
	}
}

// TestFakeChildProcess is one rank of a cross-process test; it does
// nothing unless a test above started it.
func TestFakeChildProcess(t *testing.T) {
	role := os.Getenv(childRoleEnv)
	if role == "" {
		return
	}
	nranks, err := strconv.Atoi(os.Getenv(childNranksEnv))
	require.NoError(t, err)
	rank, err := strconv.Atoi(os.Getenv(childRankEnv))
	require.NoError(t, err)
	b, err := hex.DecodeString(os.Getenv(childIDEnv))
	require.NoError(t, err)
	id, err := nccl.UniqueIDFromBytes(b)
	require.NoError(t, err)

	drv, err := driver.Load()
	require.NoError(t, err)
	require.NoError(t, drv.Init())
	lib, err := nccl.Load()
	require.NoError(t, err)
	w := &fakeWorld{drv: drv, lib: lib}
	err = w.onDevice(rank, func() error {
		c, err := lib.CommInitRank(nranks, id, rank)
		if err != nil {
			return err
		}
		switch role {
		case "collectives":
			defer lib.CommDestroy(c)
			if err := checkCollectives(w, c, nranks, rank); err != nil {
				return err
			}
			// Every rank sends to every other rank, buffered, then receives.
			for p := range nranks {
				if p == rank {
					continue
				}
				buf, err := w.put(f32s(float32(rank), float32(p)))
				if err != nil {
					return err
				}
				if err := lib.Send(buf, 2, nccl.Float32, p, c, 0); err != nil {
					return err
				}
			}
			for p := range nranks {
				if p == rank {
					continue
				}
				buf, err := w.put(make([]byte, 8))
				if err != nil {
					return err
				}
				if err := lib.Recv(buf, 2, nccl.Float32, p, c, 0); err != nil {
					return err
				}
				got, err := w.get(buf, 8)
				if err != nil {
					return err
				}
				if want := f32s(float32(p), float32(rank)); !bytes.Equal(got, want) {
					return fmt.Errorf("from rank %d got % x, want % x", p, got, want)
				}
			}
			return nil
		case "victim":
			fmt.Println("ready")
			time.Sleep(time.Minute) // killed long before
			return errors.New("the victim was not killed")
		case "waiter":
			buf, err := w.put(make([]byte, 16))
			if err != nil {
				return err
			}
			fmt.Println("blocking")
			if os.Getenv(childOpEnv) == "recv" {
				err = lib.Recv(buf, 4, nccl.Float32, 1-rank, c, 0)
			} else {
				err = lib.AllReduce(buf, buf, 4, nccl.Float32, nccl.Sum, c, 0)
			}
			var ne *nccl.Error
			if !errors.As(err, &ne) {
				return fmt.Errorf("the blocked call returned %v", err)
			}
			fmt.Printf("result %v %s\n", ne.Code, ne.Detail)
			res, err := lib.CommGetAsyncError(c)
			if err != nil {
				return err
			}
			fmt.Printf("async %v\n", res)
			return lib.CommDestroy(c)
		}
		return fmt.Errorf("unknown role %q", role)
	})
	require.NoError(t, err)
}
