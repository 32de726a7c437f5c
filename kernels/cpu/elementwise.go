package cpu

import "math"

// forElems runs fn over [0, n) in parallel chunks when n is large enough for
// the split to pay off.
func forElems(n int, fn func(lo, hi int)) { ParallelFor(n, elemGrain, fn) }

// checkSame panics unless every slice in xs has len(out) elements.
func checkSame(kernel string, n int, xs ...int) {
	for i, l := range xs {
		if l != n {
			panic(fmtLen(kernel, i, l, n))
		}
	}
}

// Add sets out[i] = a[i] + b[i]. out may alias a or b.
func Add[T Float](out, a, b []T) {
	checkSame("Add", len(out), len(a), len(b))
	forElems(len(out), func(lo, hi int) {
		o, x, y := out[lo:hi], a[lo:hi], b[lo:hi]
		for i := range o {
			o[i] = x[i] + y[i]
		}
	})
}

// Sub sets out[i] = a[i] - b[i]. out may alias a or b.
func Sub[T Float](out, a, b []T) {
	checkSame("Sub", len(out), len(a), len(b))
	forElems(len(out), func(lo, hi int) {
		o, x, y := out[lo:hi], a[lo:hi], b[lo:hi]
		for i := range o {
			o[i] = x[i] - y[i]
		}
	})
}

// Mul sets out[i] = a[i] * b[i]. out may alias a or b.
func Mul[T Float](out, a, b []T) {
	checkSame("Mul", len(out), len(a), len(b))
	forElems(len(out), func(lo, hi int) {
		o, x, y := out[lo:hi], a[lo:hi], b[lo:hi]
		for i := range o {
			o[i] = x[i] * y[i]
		}
	})
}

// Div sets out[i] = a[i] / b[i] with IEEE semantics (x/0 is ±Inf or NaN).
// out may alias a or b.
func Div[T Float](out, a, b []T) {
	checkSame("Div", len(out), len(a), len(b))
	forElems(len(out), func(lo, hi int) {
		o, x, y := out[lo:hi], a[lo:hi], b[lo:hi]
		for i := range o {
			o[i] = x[i] / y[i]
		}
	})
}

// Neg sets out[i] = -x[i]. out may alias x.
func Neg[T Float](out, x []T) {
	checkSame("Neg", len(out), len(x))
	forElems(len(out), func(lo, hi int) {
		o, v := out[lo:hi], x[lo:hi]
		for i := range o {
			o[i] = -v[i]
		}
	})
}

// Exp sets out[i] = eˣ⁽ⁱ⁾. out may alias x.
func Exp[T Float](out, x []T) {
	checkSame("Exp", len(out), len(x))
	forElems(len(out), func(lo, hi int) {
		o, v := out[lo:hi], x[lo:hi]
		for i := range o {
			o[i] = T(math.Exp(float64(v[i])))
		}
	})
}

// Log sets out[i] = ln x[i] (−Inf at 0, NaN below). out may alias x.
func Log[T Float](out, x []T) {
	checkSame("Log", len(out), len(x))
	forElems(len(out), func(lo, hi int) {
		o, v := out[lo:hi], x[lo:hi]
		for i := range o {
			o[i] = T(math.Log(float64(v[i])))
		}
	})
}

// Tanh sets out[i] = tanh x[i]. out may alias x.
func Tanh[T Float](out, x []T) {
	checkSame("Tanh", len(out), len(x))
	forElems(len(out), func(lo, hi int) {
		o, v := out[lo:hi], x[lo:hi]
		for i := range o {
			o[i] = T(math.Tanh(float64(v[i])))
		}
	})
}

// Sqrt sets out[i] = √x[i] (NaN below 0). out may alias x.
func Sqrt[T Float](out, x []T) {
	checkSame("Sqrt", len(out), len(x))
	forElems(len(out), func(lo, hi int) {
		o, v := out[lo:hi], x[lo:hi]
		for i := range o {
			o[i] = T(math.Sqrt(float64(v[i])))
		}
	})
}

// Relu sets out[i] = max(x[i], 0). out may alias x.
func Relu[T Float](out, x []T) {
	checkSame("Relu", len(out), len(x))
	forElems(len(out), func(lo, hi int) {
		o, v := out[lo:hi], x[lo:hi]
		for i := range o {
			if v[i] > 0 {
				o[i] = v[i]
			} else {
				o[i] = 0
			}
		}
	})
}

// ReluGrad sets dx[i] = dy[i] where x[i] > 0 and 0 elsewhere. dx may alias
// x or dy.
func ReluGrad[T Float](dx, x, dy []T) {
	checkSame("ReluGrad", len(dx), len(x), len(dy))
	forElems(len(dx), func(lo, hi int) {
		o, v, g := dx[lo:hi], x[lo:hi], dy[lo:hi]
		for i := range o {
			if v[i] > 0 {
				o[i] = g[i]
			} else {
				o[i] = 0
			}
		}
	})
}

// TanhGrad sets dx[i] = dy[i]·(1 − y[i]²), where y = tanh(x) is the saved
// forward output; reusing y avoids recomputing tanh. dx may alias y or dy.
func TanhGrad[T Float](dx, y, dy []T) {
	checkSame("TanhGrad", len(dx), len(y), len(dy))
	forElems(len(dx), func(lo, hi int) {
		o, t, g := dx[lo:hi], y[lo:hi], dy[lo:hi]
		for i := range o {
			o[i] = g[i] * (1 - t[i]*t[i])
		}
	})
}

// Constants of the tanh approximation of GELU.
const (
	geluC = 0.7978845608028654 // √(2/π)
	geluA = 0.044715
)

// Gelu sets out[i] = 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))), the tanh
// approximation used by GPT-2 style models. out may alias x.
func Gelu[T Float](out, x []T) {
	checkSame("Gelu", len(out), len(x))
	forElems(len(out), func(lo, hi int) {
		o, v := out[lo:hi], x[lo:hi]
		for i := range o {
			z := float64(v[i])
			o[i] = T(0.5 * z * (1 + math.Tanh(geluC*(z+geluA*z*z*z))))
		}
	})
}

// GeluGrad sets dx[i] = dy[i]·d/dx Gelu(x[i]), differentiating the same
// tanh approximation that [Gelu] evaluates so forward and backward agree.
// dx may alias x or dy.
func GeluGrad[T Float](dx, x, dy []T) {
	checkSame("GeluGrad", len(dx), len(x), len(dy))
	forElems(len(dx), func(lo, hi int) {
		o, v, g := dx[lo:hi], x[lo:hi], dy[lo:hi]
		for i := range o {
			z := float64(v[i])
			t := math.Tanh(geluC * (z + geluA*z*z*z))
			d := 0.5*(1+t) + 0.5*z*(1-t*t)*geluC*(1+3*geluA*z*z)
			o[i] = T(d * float64(g[i]))
		}
	})
}

// Scale sets out[i] = x[i]·s. out may alias x.
func Scale[T Float](out, x []T, s T) {
	checkSame("Scale", len(out), len(x))
	forElems(len(out), func(lo, hi int) {
		o, v := out[lo:hi], x[lo:hi]
		for i := range o {
			o[i] = v[i] * s
		}
	})
}

// Fill sets every element of out to v.
func Fill[T Float](out []T, v T) {
	forElems(len(out), func(lo, hi int) {
		o := out[lo:hi]
		for i := range o {
			o[i] = v
		}
	})
}
