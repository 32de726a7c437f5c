package cost

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"sync"
	"time"

	"gcompile/ir"
	kcpu "gcompile/kernels/cpu"
	"gcompile/runtime"
	"gcompile/runtime/comm"
)

// Calibrate measures the machine it runs on through the CPU backend's own
// code and returns the cpu preset with the measured rates, so that the
// model prices this machine rather than the preset's rough defaults:
//
//   - fp32 GEMM through kernels/cpu.MatMul at 32³ … 256³ (every core, as
//     the backend runs it): the roofline's time launch + (f + F½)/P fitted
//     to them gives the peak P (gemm_efficiency 1: P is what is reached)
//     and F½ (gemm_half_us = F½/P, the fixed cost beyond the launch);
//     float64 at 128³ gives the f64 peak. The 16-bit formats, which the
//     backend computes through fp32, and the vector rate keep the
//     preset's ratios to fp32;
//   - memory: a 16 MiB copy split over the cores (kcpu.ParallelFor) for
//     the bandwidth (read and write counted), a 16 KiB one for the fixed
//     cost of a small kernel (mem_half_us);
//   - launch: a 4×4×4 product, all overhead;
//   - collectives: an all-reduce between two virtual devices through the
//     backend's comm (runtime/comm.Local) of 4 KiB and 4 MiB: the α and β
//     of the intra-node link (all devices of the CPU backend share one
//     process, so there is no other link);
//   - the transformer's elementwise and row kernels (GELU and its
//     gradient, add, scale, LayerNorm and its gradients, cross-entropy
//     and its gradient, a column sum, Adam's moments and update) run on a
//     block's worth of activations: each op whose time is more than 10 %
//     off the roofline of its flops and bytes gets that ratio as its
//     op_scale (calibrateOps).
//
// Each measurement keeps the fastest of repeated runs (the machine's
// capability, not its noise), and the whole takes well under a second.
// Nothing is written to disk: a --hardware cpu run measures afresh.
func Calibrate() (*Hardware, error) {
	start := time.Now()
	h, err := Preset("cpu")
	if err != nil {
		return nil, err
	}
	base := *h
	base.PeakTFLOPS = maps.Clone(h.PeakTFLOPS)

	// GEMM: on the roofline a GEMM of f flops takes launch + (f + F½)/P,
	// a line in f: its slope is 1/P and its intercept the fixed cost,
	// fitted in relative error (weights 1/t²) so that the small sizes
	// count as much as the large ones.
	var fs, ts []float64
	var best float64
	for _, n := range []int{32, 64, 128, 256} {
		t := fastest(25*time.Millisecond, 40, gemm32(n))
		f := 2 * float64(n) * float64(n) * float64(n)
		fs, ts = append(fs, f), append(ts, t)
		best = math.Max(best, f/t)
	}
	fixed, slope := fitLine(fs, ts, nil, nil)
	peak := 1 / slope
	if !(slope > 0) || peak > 4*best || peak < best/4 {
		// Noise broke the fit: the best measured rate, no fixed cost.
		peak, fixed = best, 0
	}
	launch := fastest(5*time.Millisecond, 500, gemm32(4))
	half := math.Max(fixed-launch, 0) * peak
	ratio := func(dt string) float64 { return base.PeakTFLOPS[dt] / base.PeakTFLOPS["fp32"] }
	f64 := 2 * 128.0 * 128 * 128 / fastest(20*time.Millisecond, 20, gemm64(128))
	for dt := range h.PeakTFLOPS {
		h.PeakTFLOPS[dt] = peak * ratio(dt) / 1e12
	}
	h.PeakTFLOPS["f64"] = math.Min(f64, peak) / 1e12
	h.VectorTFLOPS = base.VectorTFLOPS * peak / (base.PeakTFLOPS["fp32"] * 1e12)
	h.GEMMEfficiency, h.GEMMHalfUS = 1, half/peak*1e6

	// Memory.
	big, small := 16<<20, 16<<10
	tBig := fastest(40*time.Millisecond, 20, copyKernel(big/4))
	tSmall := fastest(10*time.Millisecond, 200, copyKernel(small/4))
	bw := 2 * float64(big) / tBig
	h.MemoryGBps, h.MemEfficiency = bw/1e9, 1
	h.MemHalfUS = math.Max(tSmall-2*float64(small)/bw, 0) * 1e6

	// Launch: a product too small to cost anything but its call.
	h.LaunchUS = launch * 1e6

	// All-reduce over two virtual devices: ring time 2α + S·β.
	sSmall, sBig := 4<<10, 4<<20
	arSmall, err := allReduceTime(sSmall, 100)
	if err != nil {
		return nil, err
	}
	arBig, err := allReduceTime(sBig, 10)
	if err != nil {
		return nil, err
	}
	beta := (arBig - arSmall) / float64(sBig-sSmall)
	if !(beta > 0) {
		beta = arBig / float64(sBig)
	}
	alpha := math.Max((arSmall-float64(sSmall)*beta)/2, 0)
	h.IntraGBps, h.IntraLatencyUS = 1/beta/1e9, alpha*1e6
	h.InterGBps, h.InterLatencyUS = h.IntraGBps, h.IntraLatencyUS
	h.HostGBps = h.MemoryGBps

	h.OpScale = calibrateOps(h)

	h.Source = fmt.Sprintf("CPU backend, calibrated on this machine in %.0f ms: fp32 GEMM %.1f GFLOP/s (F½ %.3g µs), f64 %.1f GFLOP/s, memory %.1f GB/s, launch %.2f µs, all-reduce between 2 virtual devices %.2f GB/s after %.1f µs, %d kernels' op scales",
		float64(time.Since(start).Microseconds())/1e3, peak/1e9, h.GEMMHalfUS, f64/1e9, h.MemoryGBps, h.LaunchUS, h.IntraGBps, 2*h.IntraLatencyUS, len(h.OpScale))
	if err := h.Validate(); err != nil {
		return nil, fmt.Errorf("calibration: %w", err)
	}
	return h, nil
}

// fastest runs fn until budget has passed or reps runs are done (at
// least three) and returns the shortest run in seconds.
func fastest(budget time.Duration, reps int, fn func()) float64 {
	fn() // warm caches and goroutines
	best := math.Inf(1)
	end := time.Now().Add(budget)
	for i := 0; i < reps && (i < 3 || time.Now().Before(end)); i++ {
		t := time.Now()
		fn()
		best = math.Min(best, time.Since(t).Seconds())
	}
	return math.Max(best, 1e-9)
}

// fitLine is the least-squares y = a + b·x in relative error (each point
// weighted by 1/y²), with a or b held where one is given (a figure set on
// the command line; both given are returned as they are).
func fitLine(xs, ys []float64, heldA, heldB *float64) (a, b float64) {
	var sw, sx, sy, sxx, sxy float64
	for i := range xs {
		w := 1 / (ys[i] * ys[i])
		sw, sx, sy = sw+w, sx+w*xs[i], sy+w*ys[i]
		sxx, sxy = sxx+w*xs[i]*xs[i], sxy+w*xs[i]*ys[i]
	}
	switch {
	case heldA != nil && heldB != nil:
		return *heldA, *heldB
	case heldA != nil:
		if sxx == 0 {
			return *heldA, 0
		}
		return *heldA, (sxy - *heldA*sx) / sxx
	case heldB != nil:
		return (sy - *heldB*sx) / sw, *heldB
	}
	d := sw*sxx - sx*sx
	if d == 0 {
		return sy / sw, 0
	}
	b = (sw*sxy - sx*sy) / d
	return (sy - b*sx) / sw, b
}

func gemm32(n int) func() {
	a, b, c := make([]float32, n*n), make([]float32, n*n), make([]float32, n*n)
	for i := range a {
		a[i], b[i] = float32(i%7)*0.25, float32(i%5)*0.5
	}
	return func() { kcpu.MatMul(c, a, b, 1, n, n, n, false, false, false) }
}

func gemm64(n int) func() {
	a, b, c := make([]float64, n*n), make([]float64, n*n), make([]float64, n*n)
	for i := range a {
		a[i], b[i] = float64(i%7)*0.25, float64(i%5)*0.5
	}
	return func() { kcpu.MatMul(c, a, b, 1, n, n, n, false, false, false) }
}

// copyKernel copies n float32 split over the cores, as the backend's
// elementwise kernels run.
func copyKernel(n int) func() {
	src, dst := make([]float32, n), make([]float32, n)
	for i := range src {
		src[i] = float32(i)
	}
	return func() { kcpu.ParallelFor(n, 1<<14, func(lo, hi int) { copy(dst[lo:hi], src[lo:hi]) }) }
}

// allReduceTime is the fastest of reps all-reduces of n bytes of fp32
// between two virtual devices of one comm.Local, in seconds.
func allReduceTime(n, reps int) (float64, error) {
	c := comm.NewLocal(2)
	g := runtime.Group{Ranks: []int{0, 1}}
	bufs := [2][]byte{make([]byte, n), make([]byte, n)}
	run := func() error {
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for r := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[r] = c.AllReduce(g, r, ir.F32, bufs[r])
			}()
		}
		wg.Wait()
		return errors.Join(errs...)
	}
	if err := run(); err != nil {
		return 0, fmt.Errorf("calibration all-reduce: %w", err)
	}
	best := math.Inf(1)
	for range reps {
		t := time.Now()
		if err := run(); err != nil {
			return 0, fmt.Errorf("calibration all-reduce: %w", err)
		}
		best = math.Min(best, time.Since(t).Seconds())
	}
	return best, nil
}

// calibrateOps times the CPU backend's kernels of the ops a transformer
// step spends its non-GEMM time in, on a block's worth of data (1024
// tokens of width 256, an MLP of 1024, a vocabulary of 512), and returns
// each op's measured time over its roofline time under h (both beyond the
// launch) where they differ by more than opScaleTolerance, as Refine
// fits it from a trace. The kernels are the ones the backend runs, so the
// scale holds their float64 arithmetic and transcendental functions that
// a roofline of flops and bytes does not see.
func calibrateOps(h *Hardware) map[string]float64 {
	const rows, width, ffn, vocab = 1024, 256, 1024, 512
	f32 := func(shape ...int) ir.Type { return ir.T(ir.F32, shape...) }
	fill := func(n int) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(i%13)*0.1 - 0.6
		}
		return x
	}
	act, hid := rows*width, rows*ffn
	x, y, out := fill(act), fill(act), make([]float32, act)
	hx, hy, hout := fill(hid), fill(hid), make([]float32, hid)
	gamma, beta, dgamma := fill(width), fill(width), make([]float32, width)
	logits, dlogits := fill(rows*vocab), make([]float32, rows*vocab)
	labels := make([]int32, rows)
	for i := range labels {
		labels[i] = int32(i % vocab)
	}
	p, m, v := fill(act), fill(act), make([]float32, act)
	for i := range v {
		v[i] = 0.01
	}
	bench := []struct {
		op    string
		args  []ir.Type
		out   ir.Type
		attrs ir.Attrs
		run   func()
	}{
		{"gelu", []ir.Type{f32(rows, ffn)}, f32(rows, ffn), nil, func() { kcpu.Gelu(hout, hx) }},
		{"gelu_grad", []ir.Type{f32(rows, ffn), f32(rows, ffn)}, f32(rows, ffn), nil, func() { kcpu.GeluGrad(hout, hx, hy) }},
		{"add", []ir.Type{f32(rows, width), f32(rows, width)}, f32(rows, width), nil, func() { kcpu.Add(out, x, y) }},
		{"scale", []ir.Type{f32(rows, width), f32()}, f32(rows, width), nil, func() { kcpu.Scale(out, x, 0.5) }},
		{"layernorm", []ir.Type{f32(rows, width), f32(width), f32(width)}, f32(rows, width), ir.Attrs{"eps": 1e-5},
			func() { kcpu.LayerNorm(out, x, gamma, beta, rows, width, 1e-5) }},
		{"layernorm_grad_x", []ir.Type{f32(rows, width), f32(width), f32(rows, width)}, f32(rows, width), ir.Attrs{"eps": 1e-5},
			func() { kcpu.LayerNormGradX(out, x, gamma, y, rows, width, 1e-5) }},
		{"layernorm_grad_gamma", []ir.Type{f32(rows, width), f32(rows, width)}, f32(width), ir.Attrs{"eps": 1e-5},
			func() { kcpu.LayerNormGradGamma(dgamma, x, y, rows, width, 1e-5) }},
		{"cross_entropy", []ir.Type{f32(rows, vocab), ir.T(ir.I32, rows)}, f32(), nil,
			func() { _, _ = kcpu.CrossEntropy(logits, labels, rows, vocab) }},
		{"cross_entropy_grad", []ir.Type{f32(rows, vocab), ir.T(ir.I32, rows), f32()}, f32(rows, vocab), nil,
			func() { _ = kcpu.CrossEntropyGrad(dlogits, logits, labels, 1, rows, vocab) }},
		{"reduce_sum", []ir.Type{f32(rows, ffn)}, f32(ffn), ir.Attrs{"axes": []int{0}},
			func() { kcpu.ReduceSum(hout[:ffn], hx, []int{rows, ffn}, []int{0}) }},
		{"adam_m", []ir.Type{f32(rows, width), f32(rows, width)}, f32(rows, width), ir.Attrs{"beta1": 0.9},
			func() { kcpu.AdamMoment1(out, m, x, 0.9) }},
		{"adam_v", []ir.Type{f32(rows, width), f32(rows, width)}, f32(rows, width), ir.Attrs{"beta2": 0.95},
			func() { kcpu.AdamMoment2(out, v, x, 0.95) }},
		{"adamw", []ir.Type{f32(rows, width), f32(rows, width), f32(rows, width), f32(), ir.T(ir.I32)}, f32(rows, width),
			ir.Attrs{"beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "wd": 0.1},
			func() { kcpu.AdamW(out, p, m, v, 1e-3, 0.9, 0.95, 1e-8, 0.1, 3) }},
	}
	scale := map[string]float64{}
	launch := h.LaunchUS * 1e-6
	for _, b := range bench {
		info, ok := ir.Lookup(b.op)
		if !ok || info.Cost == nil {
			continue
		}
		f, by := info.Cost(b.args, b.out, b.attrs)
		roof := h.OpTime(b.op, b.out.DType, f, by) - launch
		t := fastest(10*time.Millisecond, 20, b.run) - launch
		if k := t / roof; roof > 0 && t > 0 && math.Abs(math.Log(k)) > math.Log1p(opScaleTolerance) {
			scale[b.op] = k
		}
	}
	if len(scale) == 0 {
		return nil
	}
	return scale
}
