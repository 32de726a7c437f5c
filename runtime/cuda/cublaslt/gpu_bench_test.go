package cublaslt_test

import (
	"math"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"gcompile/runtime/cuda/cublaslt"
	"gcompile/runtime/cuda/driver"
	"gcompile/runtime/cuda/driver/drivertest"
)

// BenchmarkGEMM times C = A·B through our cuBLASLt plans at M = N = K =
// $GCOMPILE_GEMM_SIZE (default 8192), bf16, fp16 and fp32 inputs with fp32
// accumulation, on the GPU: device events around b.N launches, inputs
// random and rotated among three sets so the L2 cache does not serve them.
// It reports TFLOP/s (2·M·N·K per product) to set beside PyTorch's matmul
// on the same GPU (bench/gpu/torch_gemm.py) and first checks a sample of
// the product against float64.
func BenchmarkGEMM(b *testing.B) {
	g := drivertest.Open(b, "time cuBLASLt")
	d, s := g.Driver, g.Stream
	n := 8192
	if s := os.Getenv("GCOMPILE_GEMM_SIZE"); s != "" {
		var err error
		n, err = strconv.Atoi(s)
		require.NoError(b, err, "GCOMPILE_GEMM_SIZE")
	}
	lt, err := cublaslt.Load()
	require.NoError(b, err)
	h, err := lt.Create()
	require.NoError(b, err)
	defer lt.Destroy(h)
	const wsBytes = 64 << 20
	ws, err := d.MemAlloc(wsBytes)
	require.NoError(b, err)
	defer d.MemFree(ws)
	start, err := d.EventCreate(0)
	require.NoError(b, err)
	end, err := d.EventCreate(0)
	require.NoError(b, err)

	for _, typ := range []cublaslt.DType{cublaslt.BF16, cublaslt.F16, cublaslt.F32} {
		b.Run(typ.String(), func(b *testing.B) {
			g.Enter(b)
			p, err := lt.NewMatmul(h, cublaslt.MatmulSpec{M: n, N: n, K: n, Type: typ, CType: typ, Batch: 1, MaxWorkspace: wsBytes})
			require.NoError(b, err)
			defer p.Close()
			rng := rand.New(rand.NewPCG(7, uint64(typ)))
			const sets = 3
			var as, bs [sets]driver.DevicePtr
			var hostA, hostB [sets][]float32
			upload := func(v []float32) driver.DevicePtr {
				buf := encode(typ, v)
				ptr, err := d.MemAlloc(uint64(len(buf)))
				require.NoError(b, err)
				b.Cleanup(func() { d.MemFree(ptr) })
				require.NoError(b, d.MemcpyHtoD(ptr, buf))
				return ptr
			}
			for i := range sets {
				for _, v := range []*[]float32{&hostA[i], &hostB[i]} {
					*v = make([]float32, n*n)
					for j := range *v {
						(*v)[j] = float32(rng.NormFloat64())
					}
					*v = decode(typ, encode(typ, *v))
				}
				as[i], bs[i] = upload(hostA[i]), upload(hostB[i])
			}
			c, err := d.MemAlloc(uint64(n * n * typ.Size()))
			require.NoError(b, err)
			defer d.MemFree(c)
			// Correct first: 64 sampled entries against float64.
			require.NoError(b, p.Run(as[0], bs[0], c, 1, 0, ws, wsBytes, s))
			require.NoError(b, d.StreamSynchronize(s))
			out := make([]byte, n*n*typ.Size())
			require.NoError(b, d.MemcpyDtoH(out, c))
			got := decode(typ, out)
			var num, den float64
			for range 64 {
				i, j := rng.IntN(n), rng.IntN(n)
				var want float64
				for x := range n {
					want += float64(hostA[0][i*n+x]) * float64(hostB[0][x*n+j])
				}
				num += (float64(got[i*n+j]) - want) * (float64(got[i*n+j]) - want)
				den += want * want
			}
			rel := math.Sqrt(num / den)
			require.Less(b, rel, 1e-2, "sampled relative error of the %v product", typ)
			for i := range 5 { // warm up
				require.NoError(b, p.Run(as[i%sets], bs[i%sets], c, 1, 0, ws, wsBytes, s))
			}
			require.NoError(b, d.StreamSynchronize(s))
			b.ResetTimer()
			require.NoError(b, d.EventRecord(start, s))
			for i := 0; i < b.N; i++ {
				if err := p.Run(as[i%sets], bs[i%sets], c, 1, 0, ws, wsBytes, s); err != nil {
					b.Fatal(err)
				}
			}
			require.NoError(b, d.EventRecord(end, s))
			require.NoError(b, d.EventSynchronize(end))
			b.StopTimer()
			ms, err := d.EventElapsed(start, end)
			require.NoError(b, err)
			per := float64(ms) / 1e3 / float64(b.N)
			b.ReportMetric(per*1e3, "ms/gemm")
			b.ReportMetric(2*float64(n)*float64(n)*float64(n)/per/1e12, "TFLOP/s")
			b.ReportMetric(rel, "rel-err")
		})
	}
}
