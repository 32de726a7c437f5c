package passes

import (
	"fmt"

	"gcompile/ir"
)

// VJP returns the gradient of the loss with respect to each argument of v,
// given dy, the gradient with respect to v, emitting the backward ops with
// ad. A nil entry means "no gradient" (integer ids and labels).
type VJP func(ad *VJPBuilder, v, dy *ir.Value) []*ir.Value

// RegisterVJP makes rule the VJP of op, an op of the ir table whose Grad
// is ir.GradVJP. It refuses an unknown op, an op the table marks as having
// no VJP, and a second rule for one op. Call it from an init function,
// after the op's ir.Register: the table is not guarded for concurrent use.
func RegisterVJP(op string, rule VJP) error {
	info, ok := ir.Lookup(op)
	switch {
	case !ok:
		return fmt.Errorf("passes: VJP for op %q, which is not in the ir op table", op)
	case rule == nil:
		return fmt.Errorf("passes: nil VJP for op %s", op)
	case info.Source:
		return fmt.Errorf("passes: op %s is a source: it has no arguments to differentiate", op)
	case info.Grad != ir.GradVJP:
		return fmt.Errorf("passes: op %s is marked grad %q in the op table, so it takes no VJP", op, info.Grad)
	}
	if _, dup := vjps[op]; dup {
		return fmt.Errorf("passes: op %s already has a VJP", op)
	}
	vjps[op] = rule
	return nil
}

// HasVJP reports whether op has a registered VJP.
func HasVJP(op string) bool {
	_, ok := vjps[op]
	return ok
}

// vjps has one rule per op the table marks ir.GradVJP. An op missing here
// cannot be on a path from a param to the loss; autodiff says so naming
// the op.
// normVJP differentiates a normalisation over the last dim, OP(x, γ[, β]):
// OP_grad_x and OP_grad_gamma recompute the row statistics from x, and
// β's gradient, where there is a β, sums dy over the rows.
func normVJP(ad *VJPBuilder, v, dy *ir.Value) []*ir.Value {
	x, gamma := v.Args[0], v.Args[1]
	eps := ir.Attrs{"eps": v.Attrs.Float("eps", 0)}
	grads := []*ir.Value{
		ad.Op(v.Op+"_grad_x", eps, x, gamma, dy),
		ad.Op(v.Op+"_grad_gamma", eps.Clone(), x, dy),
	}
	if len(v.Args) == 3 {
		grads = append(grads, ad.Op("reduce_sum", ir.Attrs{"axes": allAxes(x.Type.Rank() - 1)}, dy))
	}
	return grads
}

var vjps = map[string]VJP{
	"add": func(ad *VJPBuilder, v, dy *ir.Value) []*ir.Value { return []*ir.Value{dy, dy} },
	"sub": func(ad *VJPBuilder, v, dy *ir.Value) []*ir.Value {
		return []*ir.Value{dy, ad.Op("neg", nil, dy)}
	},
	"mul": func(ad *VJPBuilder, v, dy *ir.Value) []*ir.Value {
		return []*ir.Value{ad.Op("mul", nil, dy, v.Args[1]), ad.Op("mul", nil, dy, v.Args[0])}
	},
	"div": func(ad *VJPBuilder, v, dy *ir.Value) []*ir.Value {
		// d(a/b)/db = −(a/b)/b
		return []*ir.Value{
			ad.Op("div", nil, dy, v.Args[1]),
			ad.Op("neg", nil, ad.Op("div", nil, ad.Op("mul", nil, dy, v), v.Args[1])),
		}
	},
	"neg": func(ad *VJPBuilder, v, dy *ir.Value) []*ir.Value { return []*ir.Value{ad.Op("neg", nil, dy)} },
	"exp": func(ad *VJPBuilder, v, dy *ir.Value) []*ir.Value { return []*ir.Value{ad.Op("mul", nil, dy, v)} },
	"log": func(ad *VJPBuilder, v, dy *ir.Value) []*ir.Value {
		return []*ir.Value{ad.Op("div", nil, dy, v.Args[0])}
	},
	"sqrt": func(ad *VJPBuilder, v, dy *ir.Value) []*ir.Value {
		half := ad.Scalar(0.5, v.Type.DType)
		return []*ir.Value{ad.Op("div", nil, ad.Op("scale", nil, dy, half), v)}
	},
	"tanh": func(ad *VJPBuilder, v, dy *ir.Value) []*ir.Value {
		return []*ir.Value{ad.Op("tanh_grad", nil, v, dy)}
	},
	"gelu": func(ad *VJPBuilder, v, dy *ir.Value) []*ir.Value {
		return []*ir.Value{ad.Op("gelu_grad", nil, v.Args[0], dy)}
	},
	"relu": func(ad *VJPBuilder, v, dy *ir.Value) []*ir.Value {
		return []*ir.Value{ad.Op("relu_grad", nil, v.Args[0], dy)}
	},
	"repeat_interleave": func(ad *VJPBuilder, v, dy *ir.Value) []*ir.Value {
		return []*ir.Value{ad.Op("repeat_interleave_grad", v.Attrs.Clone(), dy)}
	},
	"silu": func(ad *VJPBuilder, v, dy *ir.Value) []*ir.Value {
		return []*ir.Value{ad.Op("silu_grad", nil, v.Args[0], dy)}
	},
	// A rotation's transpose is the rotation back.
	"rope": func(ad *VJPBuilder, v, dy *ir.Value) []*ir.Value {
		attrs := v.Attrs.Clone()
		attrs["inverse"] = !v.Attrs.Bool("inverse")
		return []*ir.Value{ad.Op("rope", attrs, dy)}
	},
	"scale": func(ad *VJPBuilder, v, dy *ir.Value) []*ir.Value {
		x, s := v.Args[0], v.Args[1]
		return []*ir.Value{
			ad.Op("scale", nil, dy, s),
			ad.Op("reduce_sum", ir.Attrs{"axes": allAxes(x.Type.Rank())}, ad.Op("mul", nil, dy, x)),
		}
	},
	"matmul": vjpMatMul,
	"reshape": func(ad *VJPBuilder, v, dy *ir.Value) []*ir.Value {
		return []*ir.Value{reshape(ad, dy, v.Args[0].Type.Shape)}
	},
	"transpose": vjpTranspose,
	"slice": func(ad *VJPBuilder, v, dy *ir.Value) []*ir.Value {
		dim := v.Attrs.Int("dim", 0)
		return []*ir.Value{ad.Op("slice_grad", ir.Attrs{"dim": dim, "start": v.Attrs.Int("start", 0), "size": v.Args[0].Type.Shape[dim]}, dy)}
	},
	"slice_grad": func(ad *VJPBuilder, v, dy *ir.Value) []*ir.Value {
		dim, start := v.Attrs.Int("dim", 0), v.Attrs.Int("start", 0)
		return []*ir.Value{ad.Op("slice", ir.Attrs{"dim": dim, "start": start, "end": start + v.Args[0].Type.Shape[dim]}, dy)}
	},
	"concat": func(ad *VJPBuilder, v, dy *ir.Value) []*ir.Value {
		dim, start := v.Attrs.Int("dim", 0), 0
		var out []*ir.Value
		for _, a := range v.Args {
			n := a.Type.Shape[dim]
			out = append(out, ad.Op("slice", ir.Attrs{"dim": dim, "start": start, "end": start + n}, dy))
			start += n
		}
		return out
	},
	"broadcast": func(ad *VJPBuilder, v, dy *ir.Value) []*ir.Value {
		return []*ir.Value{unbroadcast(ad, dy, v.Args[0].Type.Shape)}
	},
	"reduce_sum": func(ad *VJPBuilder, v, dy *ir.Value) []*ir.Value {
		return []*ir.Value{expandReduced(ad, dy, v)}
	},
	"reduce_mean": func(ad *VJPBuilder, v, dy *ir.Value) []*ir.Value {
		n := v.Args[0].Type.Shape.NumElements() / v.Type.Shape.NumElements()
		scaled := ad.Op("scale", nil, dy, ad.Scalar(1/float64(n), v.Type.DType))
		return []*ir.Value{expandReduced(ad, scaled, v)}
	},
	"reduce_max": func(ad *VJPBuilder, v, dy *ir.Value) []*ir.Value {
		return []*ir.Value{ad.Op("reduce_max_grad", v.Attrs.Clone(), v.Args[0], v, dy)}
	},
	"softmax": func(ad *VJPBuilder, v, dy *ir.Value) []*ir.Value {
		return []*ir.Value{ad.Op("softmax_grad", nil, v, dy)}
	},
	"causal_mask": func(ad *VJPBuilder, v, dy *ir.Value) []*ir.Value {
		// Masked entries do not reach the output, so their gradient is 0.
		return []*ir.Value{ad.Op("causal_mask", ir.Attrs{"fill": 0.0}, dy)}
	},
	"attention": vjpAttention,
	"layernorm": normVJP,
	"rmsnorm":   normVJP,
	"embedding": func(ad *VJPBuilder, v, dy *ir.Value) []*ir.Value {
		table, ids := v.Args[0], v.Args[1]
		return []*ir.Value{ad.Op("embedding_grad", ir.Attrs{"vocab": table.Type.Shape[0]}, ids, dy), nil}
	},
	"cross_entropy": func(ad *VJPBuilder, v, dy *ir.Value) []*ir.Value {
		return []*ir.Value{ad.Op("cross_entropy_grad", nil, v.Args[0], v.Args[1], dy), nil}
	},
	"cast": func(ad *VJPBuilder, v, dy *ir.Value) []*ir.Value {
		return []*ir.Value{ad.Op("cast", ir.Attrs{"to": v.Args[0].Type.DType.String()}, dy)}
	},
}

func allAxes(n int) []int {
	axes := make([]int, n)
	for i := range axes {
		axes[i] = i
	}
	return axes
}

func reshape(ad *VJPBuilder, x *ir.Value, shape ir.Shape) *ir.Value {
	if x == nil || x.Type.Shape.Equal(shape) {
		return x
	}
	return ad.Op("reshape", ir.Attrs{"shape": []int(shape.Clone())}, x)
}

// unbroadcast sums dy over the dims a broadcast to dy's shape expanded,
// giving a gradient of shape to.
func unbroadcast(ad *VJPBuilder, dy *ir.Value, to ir.Shape) *ir.Value {
	out := dy.Type.Shape
	off := len(out) - len(to)
	var axes []int
	for d := range out {
		if d < off || (to[d-off] == 1 && out[d] != 1) {
			axes = append(axes, d)
		}
	}
	if len(axes) == 0 {
		return reshape(ad, dy, to)
	}
	return reshape(ad, ad.Op("reduce_sum", ir.Attrs{"axes": axes}, dy), to)
}

// expandReduced broadcasts the gradient of a reduction back to its input.
func expandReduced(ad *VJPBuilder, dy, v *ir.Value) *ir.Value {
	x := v.Args[0]
	kept := ir.ReducedShape(x.Type.Shape, v.Attrs.Ints("axes"), true)
	return ad.Op("broadcast", ir.Attrs{"shape": []int(x.Type.Shape.Clone())}, reshape(ad, dy, kept))
}

func vjpTranspose(ad *VJPBuilder, v, dy *ir.Value) []*ir.Value {
	perm := v.Attrs.Ints("perm")
	inv := make([]int, len(perm))
	for i, p := range perm {
		inv[p] = i
	}
	return []*ir.Value{ad.Op("transpose", ir.Attrs{"perm": inv}, dy)}
}

func mm(ad *VJPBuilder, a, b *ir.Value, ta, tb bool) *ir.Value {
	var attrs ir.Attrs
	if ta || tb {
		attrs = ir.Attrs{}
		if ta {
			attrs["transA"] = true
		}
		if tb {
			attrs["transB"] = true
		}
	}
	return ad.Op("matmul", attrs, a, b)
}

// vjpMatMul differentiates Y = op(A)·op(B), where op transposes the last two
// dims when transA/transB is set: dA = dY·op(B)ᵀ and dB = op(A)ᵀ·dY, each
// arranged so the result comes out in the operand's stored layout. A shared
// 2-D B used with a batched A gets its gradient summed over the batch by
// folding the batch into the rows.
func vjpMatMul(ad *VJPBuilder, v, dy *ir.Value) []*ir.Value {
	a, b := v.Args[0], v.Args[1]
	ta, tb := v.Attrs.Bool("transA"), v.Attrs.Bool("transB")
	var da *ir.Value
	switch {
	case !ta && !tb:
		da = mm(ad, dy, b, false, true)
	case !ta && tb:
		da = mm(ad, dy, b, false, false)
	case b.Type.Rank() == 2 && a.Type.Rank() > 2:
		// transA with a shared B: B·dYᵀ would put the 2-D operand on the
		// left of a batched one, which matmul lacks, so form dY·op(B)ᵀ
		// ([...,m,k]) and swap its last two dims into A's layout.
		perm := allAxes(a.Type.Rank())
		r := len(perm)
		perm[r-2], perm[r-1] = perm[r-1], perm[r-2]
		da = ad.Op("transpose", ir.Attrs{"perm": perm}, mm(ad, dy, b, false, !tb))
	case ta && !tb:
		da = mm(ad, b, dy, false, true)
	default:
		da = mm(ad, b, dy, true, true)
	}
	if ad.err != nil {
		return nil
	}
	if b.Type.Rank() == 2 && a.Type.Rank() > 2 {
		// Fold the batch dims into rows: A → [batch·m, k], dY → [batch·m, n].
		if ta {
			perm := allAxes(a.Type.Rank())
			r := len(perm)
			perm[r-2], perm[r-1] = perm[r-1], perm[r-2]
			a = ad.Op("transpose", ir.Attrs{"perm": perm}, a)
			ta = false
		}
		k, n := a.Type.Shape[a.Type.Rank()-1], dy.Type.Shape[dy.Type.Rank()-1]
		rows := int(a.Type.Shape.NumElements()) / k
		a = reshape(ad, a, ir.Shape{rows, k})
		dy = reshape(ad, dy, ir.Shape{rows, n})
	}
	var db *ir.Value
	switch {
	case !tb && !ta:
		db = mm(ad, a, dy, true, false)
	case !tb && ta:
		db = mm(ad, a, dy, false, false)
	case tb && !ta:
		db = mm(ad, dy, a, true, false)
	default:
		db = mm(ad, dy, a, true, true)
	}
	return []*ir.Value{da, db}
}

// vjpAttention differentiates the fused attention as FlashAttention-2's
// backward does: the per-row log-sum-exp and D = Σ dy·out are computed
// once (attention_stats, fp32), and each gradient op recomputes the
// probabilities block by block from q, k and them, so no [s, s] tensor
// is made in the backward either. A gradient no param needs is dropped
// with the rest of the dead backward.
func vjpAttention(ad *VJPBuilder, v, dy *ir.Value) []*ir.Value {
	q, k, val := v.Args[0], v.Args[1], v.Args[2]
	stats := ad.Op("attention_stats", v.Attrs.Clone(), q, k, v, dy)
	return []*ir.Value{
		ad.Op("attention_grad_q", v.Attrs.Clone(), q, k, val, dy, stats),
		ad.Op("attention_grad_k", v.Attrs.Clone(), q, k, val, dy, stats),
		ad.Op("attention_grad_v", v.Attrs.Clone(), q, k, dy, stats),
	}
}
