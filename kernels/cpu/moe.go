package cpu

import (
	"cmp"
	"fmt"
	"math"
	"slices"
)

// MoEDims are the sizes of one mixture-of-experts routing problem: groups
// G of T tokens with hidden size M, E experts of C slots each (the
// layouts are in package ir's moe.go).
type MoEDims struct{ G, T, M, E, C int }

func (d MoEDims) check(kernel string) {
	if d.G < 0 || d.T < 0 || d.M < 0 || d.E < 0 || d.C < 0 {
		panic(fmt.Sprintf("cpu.%s: negative size in %+v", kernel, d))
	}
}

// topKey orders a row's elements for the top-k: larger first, NaN last,
// ties to the lower index.
func topKey[T Float](x []T) func(a, b int32) int {
	return func(a, b int32) int {
		va, vb := float64(x[a]), float64(x[b])
		na, nb := math.IsNaN(va), math.IsNaN(vb)
		switch {
		case na != nb:
			if na {
				return 1
			}
			return -1
		case !na && va != vb:
			if va > vb {
				return -1
			}
			return 1
		}
		return cmp.Compare(a, b)
	}
}

// TopKMask writes 1 at the k largest elements of each row of x (rows of
// n) and 0 elsewhere. Ties go to the lower index and NaN ranks below every
// number, so the choice is a function of the row alone.
func TopKMask[T Float](out, x []T, rows, n, k int) {
	checkRows("TopKMask", rows, n, len(out), len(x))
	if k < 0 || k > n {
		panic(fmt.Sprintf("cpu.TopKMask: k=%d outside 0..%d", k, n))
	}
	ParallelFor(rows, max(1, 4096/max(n, 1)), func(lo, hi int) {
		idx := make([]int32, n)
		for r := lo; r < hi; r++ {
			row, o := x[r*n:(r+1)*n], out[r*n:(r+1)*n]
			clear(o)
			for i := range idx {
				idx[i] = int32(i)
			}
			slices.SortFunc(idx, topKey(row))
			for _, i := range idx[:k] {
				o[i] = 1
			}
		}
	})
}

// Less writes 1 where a < b and 0 elsewhere.
func Less[T Float](out, a, b []T) {
	checkRows("Less", 1, len(out), len(a), len(b))
	for i := range out {
		out[i] = 0
		if a[i] < b[i] {
			out[i] = 1
		}
	}
}

// MoERoute fills src[G, E, C] with the token of each expert slot (−1 for
// an empty one) from the scores [G, T, E] and the 0/1 selection mask
// [G, T, E]. Within a group, every token's first choice (its selected
// expert of highest score, ties to the lower expert) is placed in token
// order, then every second choice, and so on; a choice whose expert is
// full is dropped.
func MoERoute[T Float](src []int32, scores, mask []T, d MoEDims) {
	d.check("MoERoute")
	checkRows("MoERoute", d.G, d.T*d.E, len(scores), len(mask))
	checkRows("MoERoute", d.G, d.E*d.C, len(src))
	ParallelFor(d.G, 1, func(lo, hi int) {
		count := make([]int, d.E)
		// choices[t] holds token t's selected experts, best first.
		choices := make([][]int32, d.T)
		for g := lo; g < hi; g++ {
			out := src[g*d.E*d.C : (g+1)*d.E*d.C]
			for i := range out {
				out[i] = -1
			}
			clear(count)
			most := 0
			for t := range d.T {
				row := scores[(g*d.T+t)*d.E : (g*d.T+t+1)*d.E]
				sel := mask[(g*d.T+t)*d.E : (g*d.T+t+1)*d.E]
				ch := choices[t][:0]
				for e, m := range sel {
					if m != 0 {
						ch = append(ch, int32(e))
					}
				}
				slices.SortFunc(ch, topKey(row))
				choices[t] = ch
				most = max(most, len(ch))
			}
			for rank := range most {
				for t, ch := range choices {
					if rank >= len(ch) {
						continue
					}
					e := int(ch[rank])
					if count[e] < d.C {
						out[e*d.C+count[e]] = int32(t)
						count[e]++
					}
				}
			}
		}
	})
}

// MoEDispatch gathers tokens into the expert buffer: out[e, g, c, :] =
// w[g, e, c]·x[g, src[g, e, c], :], zero for an empty slot; w may be nil
// (weight 1).
func MoEDispatch[T Float](out, x []T, src []int32, w []T, d MoEDims) error {
	d.check("MoEDispatch")
	checkRows("MoEDispatch", d.E*d.G*d.C, d.M, len(out))
	checkRows("MoEDispatch", d.G*d.T, d.M, len(x))
	return forSlots(src, d, func(g, e, c, t int) {
		o := out[((e*d.G+g)*d.C+c)*d.M:][:d.M]
		if t < 0 {
			clear(o)
			return
		}
		row := x[(g*d.T+t)*d.M:][:d.M]
		if w == nil {
			copy(o, row)
			return
		}
		s := w[(g*d.E+e)*d.C+c]
		for i, v := range row {
			o[i] = s * v
		}
	})
}

// forSlots checks every index of src and then calls fn on each slot,
// groups split over the cores; fn must touch only its group's data.
func forSlots(src []int32, d MoEDims, fn func(g, e, c, t int)) error {
	checkRows("moe", d.G, d.E*d.C, len(src))
	for i, t := range src {
		if t < -1 || int(t) >= d.T {
			g, e, c := i/(d.E*d.C), i/d.C%d.E, i%d.C
			return fmt.Errorf("moe: slot (group %d, expert %d, position %d) names token %d of a group of %d", g, e, c, t, d.T)
		}
	}
	ParallelFor(d.G, 1, func(lo, hi int) {
		for g := lo; g < hi; g++ {
			for e := range d.E {
				for c := range d.C {
					fn(g, e, c, int(src[(g*d.E+e)*d.C+c]))
				}
			}
		}
	})
	return nil
}

// MoECombine scatters the experts' results back to their tokens: out[g,
// t, :] = Σ w[g, e, c]·y[e, g, c, :] over the slots holding t, experts in
// ascending order, so the sum's order is fixed; a token in no slot gets
// zeros. w may be nil (weight 1).
func MoECombine[T Float](out, y []T, src []int32, w []T, d MoEDims) error {
	d.check("MoECombine")
	checkRows("MoECombine", d.E*d.G*d.C, d.M, len(y))
	checkRows("MoECombine", d.G*d.T, d.M, len(out))
	clear(out)
	return forSlots(src, d, func(g, e, c, t int) {
		if t < 0 {
			return
		}
		o := out[(g*d.T+t)*d.M:][:d.M]
		row := y[((e*d.G+g)*d.C+c)*d.M:][:d.M]
		if w == nil {
			for i, v := range row {
				o[i] += v
			}
			return
		}
		s := w[(g*d.E+e)*d.C+c]
		for i, v := range row {
			o[i] += s * v
		}
	})
}

// MoESlotDot is the gradient of a slot weight: out[g, e, c] = y[e, g, c,
// :]·x[g, src, :], summed in float64, zero for an empty slot.
func MoESlotDot[T Float](out, y, x []T, src []int32, d MoEDims) error {
	d.check("MoESlotDot")
	checkRows("MoESlotDot", d.E*d.G*d.C, d.M, len(y))
	checkRows("MoESlotDot", d.G*d.T, d.M, len(x))
	checkRows("MoESlotDot", d.G, d.E*d.C, len(out))
	return forSlots(src, d, func(g, e, c, t int) {
		o := &out[(g*d.E+e)*d.C+c]
		if t < 0 {
			*o = 0
			return
		}
		row, xr := y[((e*d.G+g)*d.C+c)*d.M:][:d.M], x[(g*d.T+t)*d.M:][:d.M]
		var s float64
		for i, v := range row {
			s += float64(v) * float64(xr[i])
		}
		*o = T(s)
	})
}

// MoESlotGather reads each slot's router weight: out[g, e, c] = p[g,
// src[g, e, c], e], zero for an empty slot.
func MoESlotGather[T Float](out, p []T, src []int32, d MoEDims) error {
	d.check("MoESlotGather")
	checkRows("MoESlotGather", d.G*d.T, d.E, len(p))
	checkRows("MoESlotGather", d.G, d.E*d.C, len(out))
	return forSlots(src, d, func(g, e, c, t int) {
		o := &out[(g*d.E+e)*d.C+c]
		if t < 0 {
			*o = 0
			return
		}
		*o = p[(g*d.T+t)*d.E+e]
	})
}

// MoESlotScatter is MoESlotGather's vjp: out[g, src[g, e, c], e] +=
// w[g, e, c], zeros elsewhere.
func MoESlotScatter[T Float](out, w []T, src []int32, d MoEDims) error {
	d.check("MoESlotScatter")
	checkRows("MoESlotScatter", d.G, d.E*d.C, len(w))
	checkRows("MoESlotScatter", d.G*d.T, d.E, len(out))
	clear(out)
	return forSlots(src, d, func(g, e, c, t int) {
		if t >= 0 {
			out[(g*d.T+t)*d.E+e] += w[(g*d.E+e)*d.C+c]
		}
	})
}
