package cpu

import (
	"fmt"
	"math"

	"gcompile/ir"
	kcpu "gcompile/kernels/cpu"
	"gcompile/lower"
	"gcompile/runtime"
	"gcompile/runtime/comm"
)

// vocabAxis finds the mesh axis that splits the vocabulary dim of a value
// (logits dim 1 or table dim 0), or -1.
func vocabAxis(v *ir.Value, dim int) int {
	for i, p := range v.Place {
		if p.Kind == ir.Shard && p.Dim == dim {
			return i
		}
	}
	return -1
}

// compileVocabParallel handles embedding and cross-entropy whose
// vocabulary is split across a mesh axis (Megatron's vocab-parallel
// layers). ok is false when the vocabulary is whole on this device.
func compileVocabParallel[T kcpu.Float](d *Device, in lower.Instr) (f func() error, handled bool, err error) {
	if d.prog.Mesh == nil {
		return nil, false, nil
	}
	switch in.Op {
	case "embedding":
		offset, _, split := runtime.VocabRows(d.prog.Mesh, in.Value.Args[0], d.coords)
		if !split {
			return nil, false, nil
		}
		ids, err := int32Arg(d, in, 1)
		if err != nil {
			return nil, true, err
		}
		table, out := view[T](d, in.Args[0]), view[T](d, in.Out)
		rows, dim := in.ArgTypes[0].Shape[0], in.ArgTypes[0].Shape[1]
		return ok(func() { kcpu.EmbeddingRange(out, table, ids, offset, rows, dim) }), true, nil
	case "cross_entropy", "cross_entropy_grad":
		ax := vocabAxis(in.Value.Args[0], 1)
		if ax < 0 {
			return nil, false, nil
		}
		labels, err := int32Arg(d, in, 1)
		if err != nil {
			return nil, true, err
		}
		vp := &vocabCE[T]{d: d, g: d.axisGroup(ax), logits: view[T](d, in.Args[0]), labels: labels,
			rows: in.ArgTypes[0].Shape[0], vocab: in.ArgTypes[0].Shape[1]}
		vp.offset = d.coords[ax] * vp.vocab
		vp.max = make([]float64, vp.rows)
		vp.maxes = make([]float64, vp.rows*vp.g.Size())
		vp.sums = make([]float64, 2*vp.rows)
		out := view[T](d, in.Out)
		if in.Op == "cross_entropy" {
			return func() error {
				if err := vp.stats(); err != nil {
					return err
				}
				var loss float64
				for r := range vp.rows {
					loss += math.Log(vp.sums[r]) + vp.max[r] - vp.sums[vp.rows+r]
				}
				out[0] = T(loss / float64(vp.rows))
				return nil
			}, true, nil
		}
		dloss := view[T](d, in.Args[2])
		return func() error {
			if err := vp.stats(); err != nil {
				return err
			}
			scale := float64(dloss[0]) / float64(vp.rows)
			exp := vp.exp()
			for r := range vp.rows {
				row := vp.logits[r*vp.vocab : (r+1)*vp.vocab]
				o := out[r*vp.vocab : (r+1)*vp.vocab]
				k := scale / vp.sums[r]
				for j, l := range row {
					o[j] = T(exp(float64(l)-vp.max[r]) * k)
				}
				if c := int(vp.labels[r]) - vp.offset; c >= 0 && c < vp.vocab {
					o[c] -= T(scale)
				}
			}
			return nil
		}, true, nil
	}
	return nil, false, nil
}

// vocabCE computes, per row, the global max logit, the sum of exponentials
// and the target logit over a vocabulary split across a group, exchanging
// only rows-sized vectors: no device holds full-vocabulary logits.
type vocabCE[T kcpu.Float] struct {
	d                   *Device
	g                   runtime.Group
	logits              []T
	labels              []int32
	rows, vocab, offset int
	max, maxes, sums    []float64 // sums: Σexp for each row, then target logits
}

// exp is the exponential of the logits less their max: on float32
// logits the single-device cross-entropy's (kcpu.ExpForFloat32), so the
// split and the whole vocabulary agree; math.Exp on float64.
func (v *vocabCE[T]) exp() func(float64) float64 {
	if _, ok := any(v.logits).([]float32); ok {
		return kcpu.ExpForFloat32
	}
	return math.Exp
}

func (v *vocabCE[T]) stats() error {
	exp := v.exp()
	for r := range v.rows {
		m := math.Inf(-1)
		for _, l := range v.logits[r*v.vocab : (r+1)*v.vocab] {
			m = math.Max(m, float64(l))
		}
		v.max[r] = m
	}
	if err := comm.AllGather(v.d.comm, v.g, v.d.rank, v.max, v.maxes); err != nil {
		return fmt.Errorf("vocab-parallel max: %w", err)
	}
	n := v.g.Size()
	for r := range v.rows {
		m := math.Inf(-1)
		for p := range n {
			m = math.Max(m, v.maxes[p*v.rows+r])
		}
		v.max[r] = m
		var s float64
		for _, l := range v.logits[r*v.vocab : (r+1)*v.vocab] {
			s += exp(float64(l) - m)
		}
		v.sums[r] = s
		v.sums[v.rows+r] = 0
		label := int(v.labels[r])
		if c := label - v.offset; c >= 0 && c < v.vocab {
			v.sums[v.rows+r] = float64(v.logits[r*v.vocab+c])
		}
	}
	if err := comm.AllReduce(v.d.comm, v.g, v.d.rank, v.sums); err != nil {
		return fmt.Errorf("vocab-parallel sums: %w", err)
	}
	return nil
}
