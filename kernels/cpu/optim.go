package cpu

import "math"

// AdamMoment1 sets mOut = β1·m + (1−β1)·g, the first-moment update of Adam.
// mOut may alias m so the runtime can update the state in place.
func AdamMoment1[T Float](mOut, m, g []T, beta1 T) {
	checkSame("AdamMoment1", len(mOut), len(m), len(g))
	forElems(len(mOut), func(lo, hi int) {
		o, mm, gg := mOut[lo:hi], m[lo:hi], g[lo:hi]
		for i := range o {
			o[i] = beta1*mm[i] + (1-beta1)*gg[i]
		}
	})
}

// AdamMoment2 sets vOut = β2·v + (1−β2)·g², the second-moment update of
// Adam. vOut may alias v.
func AdamMoment2[T Float](vOut, v, g []T, beta2 T) {
	checkSame("AdamMoment2", len(vOut), len(v), len(g))
	forElems(len(vOut), func(lo, hi int) {
		o, vv, gg := vOut[lo:hi], v[lo:hi], g[lo:hi]
		for i := range o {
			o[i] = beta2*vv[i] + (1-beta2)*gg[i]*gg[i]
		}
	})
}

// AdamW applies one PyTorch-style AdamW step with bias correction, given the
// already-updated moments m and v:
//
//	p' = p − lr·wd·p − lr·(m/(1−β1^step)) / (√(v/(1−β2^step)) + eps)
//
// step counts from 1; a smaller value is treated as 1 because the bias
// correction would otherwise divide by zero. pOut may alias p.
func AdamW[T Float](pOut, p, m, v []T, lr, beta1, beta2, eps, weightDecay T, step int) {
	checkSame("AdamW", len(pOut), len(p), len(m), len(v))
	step = max(step, 1)
	bc1 := 1 - math.Pow(float64(beta1), float64(step))
	bc2 := 1 - math.Pow(float64(beta2), float64(step))
	lr64, eps64, decay := float64(lr), float64(eps), float64(lr)*float64(weightDecay)
	forElems(len(pOut), func(lo, hi int) {
		o, pp, mm, vv := pOut[lo:hi], p[lo:hi], m[lo:hi], v[lo:hi]
		for i := range o {
			x := float64(pp[i])
			upd := lr64 * (float64(mm[i]) / bc1) / (math.Sqrt(float64(vv[i])/bc2) + eps64)
			o[i] = T(x - decay*x - upd)
		}
	})
}

// SGDMomentum sets bufOut = momentum·buf + (g + wd·p), PyTorch's SGD
// momentum buffer with dampening 0. Starting from a zero buffer, the first
// step yields g + wd·p as PyTorch does. bufOut may alias buf.
func SGDMomentum[T Float](bufOut, buf, g, p []T, momentum, weightDecay T) {
	checkSame("SGDMomentum", len(bufOut), len(buf), len(g), len(p))
	forElems(len(bufOut), func(lo, hi int) {
		o, b, gg, pp := bufOut[lo:hi], buf[lo:hi], g[lo:hi], p[lo:hi]
		for i := range o {
			o[i] = momentum*b[i] + (gg[i] + weightDecay*pp[i])
		}
	})
}

// SGDUpdate sets pOut = p − lr·buf. pOut may alias p.
func SGDUpdate[T Float](pOut, p, buf []T, lr T) {
	checkSame("SGDUpdate", len(pOut), len(p), len(buf))
	forElems(len(pOut), func(lo, hi int) {
		o, pp, b := pOut[lo:hi], p[lo:hi], buf[lo:hi]
		for i := range o {
			o[i] = pp[i] - lr*b[i]
		}
	})
}
