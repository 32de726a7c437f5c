package cuda

import (
	"fmt"

	"gcompile/ir"
	"gcompile/runtime"
	"gcompile/runtime/cuda/driver"
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

// orVocabParallel prepares an embedding or cross-entropy as the
// vocab-parallel layer when its vocabulary is split across the mesh, and
// with f when it is whole on this device.
func orVocabParallel(f prepare) prepare {
	return func(c *compiler) (func() error, error) {
		if run, handled, err := c.vocabParallel(); handled || err != nil {
			return run, err
		}
		return f(c)
	}
}

// vocabParallel handles embedding and cross-entropy whose vocabulary is
// split across a mesh axis (Megatron's vocab-parallel layers), as the CPU
// backend's compileVocabParallel does; handled is false when the
// vocabulary is whole on this device. The cross-entropy exchanges only
// rows-sized vectors: each device's row maxima (all-gathered), then the
// sums of exponentials and the target logits (all-reduced in group
// order); no device holds full-vocabulary logits.
func (c *compiler) vocabParallel() (f func() error, handled bool, err error) {
	in, d := c.in, c.d
	if d.prog.Mesh == nil {
		return nil, false, nil
	}
	switch in.Op {
	case "embedding":
		offset, _, split := runtime.VocabRows(d.prog.Mesh, in.Value.Args[0], d.coords)
		if !split {
			return nil, false, nil
		}
		s := c.shape(0)
		rows, dim := int64(s[0]), int64(s[1])
		f, err := c.one("gc_embedding_range", c.out(), c.arg(0), c.arg(1), numel(c.shape(1)), int64(offset), rows, dim)
		return f, true, err
	case "cross_entropy", "cross_entropy_grad":
	default:
		return nil, false, nil
	}
	ax := vocabAxis(in.Value.Args[0], 1)
	if ax < 0 {
		return nil, false, nil
	}
	if d.comm == nil {
		return nil, true, fmt.Errorf("vocab-parallel %s needs a multi-device program", in.Op)
	}
	g := d.axisGroup(ax)
	s := c.shape(0)
	rows, vocab := int64(s[0]), int64(s[1])
	offset := int64(d.coords[ax]) * vocab
	parts := g.size()
	f32 := func(n int64) parg { return parg{at: c.scratch(4 * n), dt: ir.F32} }
	rowmax, maxes, sums, total, gmax, tmp := f32(rows), f32(int64(parts)*rows), f32(2*rows), f32(2*rows), f32(rows), f32(2*rows)
	gather, err := d.comm.site(d)
	if err != nil {
		return nil, true, err
	}
	reduce, err := d.comm.site(d)
	if err != nil {
		return nil, true, err
	}
	lmax, err := c.kernel("gc_vocab_ce_max", rowmax, c.arg(0), rows, vocab)
	if err != nil {
		return nil, true, err
	}
	lsums, err := c.kernel("gc_vocab_ce_sums", sums, gmax, c.arg(0), c.arg(1), maxes, rows, vocab, offset, parts)
	if err != nil {
		return nil, true, err
	}
	var last *launch
	if in.Op == "cross_entropy" {
		last, err = c.kernel("gc_vocab_ce_loss", c.out(), total, gmax, rows)
	} else {
		last, err = c.kernel("gc_vocab_ce_grad", c.out(), c.arg(0), c.arg(1), gmax, total, c.arg(2), rows, vocab, offset)
	}
	if err != nil {
		return nil, true, err
	}
	c.note(fmt.Sprintf("vocab-parallel exchange over devices %v", g.ranks))
	cm := d.comm
	return seq(
		c.runs(lmax),
		func() error {
			if err := cm.allGather(d, g, gather, d.ptr(rowmax.at), d.ptr(maxes.at), 4*rows); err != nil {
				return fmt.Errorf("vocab-parallel max: %w", err)
			}
			return nil
		},
		c.runs(lsums),
		func() error {
			if err := d.rt.drv.MemcpyDtoDAsync(d.ptr(total.at), d.ptr(sums.at), uint64(8*rows), d.compute); err != nil {
				return err
			}
			if err := cm.allReduce(d, g, reduce, []driver.DevicePtr{d.ptr(total.at)}, []int64{2 * rows}, d.ptr(tmp.at)); err != nil {
				return fmt.Errorf("vocab-parallel sums: %w", err)
			}
			return nil
		},
		c.runs(last),
	), true, nil
}
