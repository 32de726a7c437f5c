package cublaslt_test

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	kcpu "gcompile/kernels/cpu"
	"gcompile/runtime/cuda/cublaslt"
	"gcompile/runtime/cuda/driver"
	"gcompile/runtime/cuda/driver/drivertest"
)

func encode(t cublaslt.DType, v []float32) []byte {
	b := make([]byte, len(v)*t.Size())
	for i, x := range v {
		switch t {
		case cublaslt.F32:
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
		case cublaslt.F16:
			binary.LittleEndian.PutUint16(b[2*i:], kcpu.F16FromF32(x))
		case cublaslt.BF16:
			binary.LittleEndian.PutUint16(b[2*i:], kcpu.BF16FromF32(x))
		}
	}
	return b
}

func decode(t cublaslt.DType, b []byte) []float32 {
	out := make([]float32, len(b)/t.Size())
	for i := range out {
		switch t {
		case cublaslt.F32:
			out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
		case cublaslt.F16:
			out[i] = kcpu.F32FromF16(binary.LittleEndian.Uint16(b[2*i:]))
		case cublaslt.BF16:
			out[i] = kcpu.F32FromBF16(binary.LittleEndian.Uint16(b[2*i:]))
		}
	}
	return out
}

func TestRealCuBLASLtMatmul(t *testing.T) {
	g := drivertest.Open(t, "test against the real cuBLASLt")
	d, s := g.Driver, g.Stream

	lt, err := cublaslt.Load()
	require.NoError(t, err)
	t.Logf("cuBLASLt %d from %s", lt.Version(), lt.Path())
	h, err := lt.Create()
	require.NoError(t, err)
	defer lt.Destroy(h)
	const wsBytes = 32 << 20
	ws, err := d.MemAlloc(wsBytes)
	require.NoError(t, err)
	defer d.MemFree(ws)

	rng := rand.New(rand.NewPCG(5, 6))
	const M, N, K, batch = 96, 80, 64, 3
	for _, typ := range [][2]cublaslt.DType{{cublaslt.F32, cublaslt.F32}, {cublaslt.F16, cublaslt.F16}, {cublaslt.BF16, cublaslt.BF16}, {cublaslt.BF16, cublaslt.F32}} {
		for _, tr := range [][2]bool{{false, false}, {false, true}, {true, false}, {true, true}} {
			name := fmt.Sprintf("%v->%v/ta=%v/tb=%v", typ[0], typ[1], tr[0], tr[1])
			t.Run(name, func(t *testing.T) {
				g.Enter(t) // a subtest runs on its own goroutine
				spec := cublaslt.MatmulSpec{M: M, N: N, K: K, TransA: tr[0], TransB: tr[1], Type: typ[0], CType: typ[1], Batch: batch, MaxWorkspace: wsBytes}
				p, err := lt.NewMatmul(h, spec)
				require.NoError(t, err)
				defer p.Close()
				a, b, c := make([]float32, batch*M*K), make([]float32, batch*K*N), make([]float32, batch*M*N)
				for _, v := range [][]float32{a, b, c} {
					for i := range v {
						v[i] = float32(rng.IntN(9)-4) / 4
					}
				}
				// Round the inputs as the device sees them.
				a, b, c = decode(typ[0], encode(typ[0], a)), decode(typ[0], encode(typ[0], b)), decode(typ[1], encode(typ[1], c))
				upload := func(dt cublaslt.DType, v []float32) driver.DevicePtr {
					buf := encode(dt, v)
					ptr, err := d.MemAlloc(uint64(len(buf)))
					require.NoError(t, err)
					t.Cleanup(func() { d.MemFree(ptr) })
					require.NoError(t, d.MemcpyHtoD(ptr, buf))
					return ptr
				}
				da, db, dc := upload(typ[0], a), upload(typ[0], b), upload(typ[1], c)
				require.NoError(t, p.Run(da, db, dc, 1.25, 0.5, ws, wsBytes, s))
				require.NoError(t, d.StreamSynchronize(s))
				out := make([]byte, batch*M*N*typ[1].Size())
				require.NoError(t, d.MemcpyDtoH(out, dc))
				got := decode(typ[1], out)
				tol := 1e-4
				if typ[1] != cublaslt.F32 {
					tol = 1e-2
				}
				for bt := 0; bt < batch; bt++ {
					for i := 0; i < M; i++ {
						for j := 0; j < N; j++ {
							var acc float64
							for k := 0; k < K; k++ {
								ai := bt*M*K + i*K + k
								if tr[0] {
									ai = bt*M*K + k*M + i
								}
								bi := bt*K*N + k*N + j
								if tr[1] {
									bi = bt*K*N + j*K + k
								}
								acc += float64(a[ai]) * float64(b[bi])
							}
							ci := bt*M*N + i*N + j
							want := 1.25*acc + 0.5*float64(c[ci])
							require.InDelta(t, want, float64(got[ci]), tol*(1+math.Abs(want)), "batch %d C[%d][%d]", bt, i, j)
						}
					}
				}
			})
		}
	}
}
