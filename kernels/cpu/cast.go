package cpu

// Cast converts every element of in to To using Go conversion rules:
// floats round to nearest, float to integer truncates toward zero. As in
// Go, converting a NaN, an infinity or an out-of-range float to an integer
// type gives an unspecified value rather than an error, so callers that
// need checked conversion must range-check first.
func Cast[From, To Number](out []To, in []From) {
	checkSame("Cast", len(out), len(in))
	forElems(len(out), func(lo, hi int) {
		o, x := out[lo:hi], in[lo:hi]
		for i := range o {
			o[i] = To(x[i])
		}
	})
}
