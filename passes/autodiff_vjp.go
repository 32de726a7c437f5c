package passes

import (
	"gcompile/ir"
)

// vjp returns the gradient of the loss with respect to each argument of v,
// given dy, the gradient with respect to v. A nil entry means "no gradient"
// (integer ids and labels).
type vjp func(ad *adBuilder, v, dy *ir.Value) []*ir.Value

// vjps has one rule per differentiable op. An op missing here cannot be on
// a path from a param to the loss; autodiff says so naming the op.
var vjps = map[string]vjp{
	"add": func(ad *adBuilder, v, dy *ir.Value) []*ir.Value { return []*ir.Value{dy, dy} },
	"sub": func(ad *adBuilder, v, dy *ir.Value) []*ir.Value {
		return []*ir.Value{dy, ad.op("neg", nil, dy)}
	},
	"mul": func(ad *adBuilder, v, dy *ir.Value) []*ir.Value {
		return []*ir.Value{ad.op("mul", nil, dy, v.Args[1]), ad.op("mul", nil, dy, v.Args[0])}
	},
	"div": func(ad *adBuilder, v, dy *ir.Value) []*ir.Value {
		// d(a/b)/db = −(a/b)/b
		return []*ir.Value{
			ad.op("div", nil, dy, v.Args[1]),
			ad.op("neg", nil, ad.op("div", nil, ad.op("mul", nil, dy, v), v.Args[1])),
		}
	},
	"neg": func(ad *adBuilder, v, dy *ir.Value) []*ir.Value { return []*ir.Value{ad.op("neg", nil, dy)} },
	"exp": func(ad *adBuilder, v, dy *ir.Value) []*ir.Value { return []*ir.Value{ad.op("mul", nil, dy, v)} },
	"log": func(ad *adBuilder, v, dy *ir.Value) []*ir.Value {
		return []*ir.Value{ad.op("div", nil, dy, v.Args[0])}
	},
	"sqrt": func(ad *adBuilder, v, dy *ir.Value) []*ir.Value {
		half := ad.scalar(0.5, v.Type.DType)
		return []*ir.Value{ad.op("div", nil, ad.op("scale", nil, dy, half), v)}
	},
	"tanh": func(ad *adBuilder, v, dy *ir.Value) []*ir.Value {
		return []*ir.Value{ad.op("tanh_grad", nil, v, dy)}
	},
	"gelu": func(ad *adBuilder, v, dy *ir.Value) []*ir.Value {
		return []*ir.Value{ad.op("gelu_grad", nil, v.Args[0], dy)}
	},
	"relu": func(ad *adBuilder, v, dy *ir.Value) []*ir.Value {
		return []*ir.Value{ad.op("relu_grad", nil, v.Args[0], dy)}
	},
	"scale": func(ad *adBuilder, v, dy *ir.Value) []*ir.Value {
		x, s := v.Args[0], v.Args[1]
		return []*ir.Value{
			ad.op("scale", nil, dy, s),
			ad.op("reduce_sum", ir.Attrs{"axes": allAxes(x.Type.Rank())}, ad.op("mul", nil, dy, x)),
		}
	},
	"matmul": vjpMatMul,
	"reshape": func(ad *adBuilder, v, dy *ir.Value) []*ir.Value {
		return []*ir.Value{reshape(ad, dy, v.Args[0].Type.Shape)}
	},
	"transpose": vjpTranspose,
	"slice": func(ad *adBuilder, v, dy *ir.Value) []*ir.Value {
		dim := v.Attrs.Int("dim", 0)
		return []*ir.Value{ad.op("slice_grad", ir.Attrs{"dim": dim, "start": v.Attrs.Int("start", 0), "size": v.Args[0].Type.Shape[dim]}, dy)}
	},
	"slice_grad": func(ad *adBuilder, v, dy *ir.Value) []*ir.Value {
		dim, start := v.Attrs.Int("dim", 0), v.Attrs.Int("start", 0)
		return []*ir.Value{ad.op("slice", ir.Attrs{"dim": dim, "start": start, "end": start + v.Args[0].Type.Shape[dim]}, dy)}
	},
	"concat": func(ad *adBuilder, v, dy *ir.Value) []*ir.Value {
		dim, start := v.Attrs.Int("dim", 0), 0
		var out []*ir.Value
		for _, a := range v.Args {
			n := a.Type.Shape[dim]
			out = append(out, ad.op("slice", ir.Attrs{"dim": dim, "start": start, "end": start + n}, dy))
			start += n
		}
		return out
	},
	"broadcast": func(ad *adBuilder, v, dy *ir.Value) []*ir.Value {
		return []*ir.Value{unbroadcast(ad, dy, v.Args[0].Type.Shape)}
	},
	"reduce_sum": func(ad *adBuilder, v, dy *ir.Value) []*ir.Value {
		return []*ir.Value{expandReduced(ad, dy, v)}
	},
	"reduce_mean": func(ad *adBuilder, v, dy *ir.Value) []*ir.Value {
		n := v.Args[0].Type.Shape.NumElements() / v.Type.Shape.NumElements()
		scaled := ad.op("scale", nil, dy, ad.scalar(1/float64(n), v.Type.DType))
		return []*ir.Value{expandReduced(ad, scaled, v)}
	},
	"reduce_max": func(ad *adBuilder, v, dy *ir.Value) []*ir.Value {
		return []*ir.Value{ad.op("reduce_max_grad", v.Attrs.Clone(), v.Args[0], v, dy)}
	},
	"softmax": func(ad *adBuilder, v, dy *ir.Value) []*ir.Value {
		return []*ir.Value{ad.op("softmax_grad", nil, v, dy)}
	},
	"causal_mask": func(ad *adBuilder, v, dy *ir.Value) []*ir.Value {
		// Masked entries do not reach the output, so their gradient is 0.
		return []*ir.Value{ad.op("causal_mask", ir.Attrs{"fill": 0.0}, dy)}
	},
	"layernorm": func(ad *adBuilder, v, dy *ir.Value) []*ir.Value {
		x, gamma := v.Args[0], v.Args[1]
		eps := ir.Attrs{"eps": v.Attrs.Float("eps", 0)}
		return []*ir.Value{
			ad.op("layernorm_grad_x", eps, x, gamma, dy),
			ad.op("layernorm_grad_gamma", eps.Clone(), x, dy),
			ad.op("reduce_sum", ir.Attrs{"axes": allAxes(x.Type.Rank() - 1)}, dy),
		}
	},
	"embedding": func(ad *adBuilder, v, dy *ir.Value) []*ir.Value {
		table, ids := v.Args[0], v.Args[1]
		return []*ir.Value{ad.op("embedding_grad", ir.Attrs{"vocab": table.Type.Shape[0]}, ids, dy), nil}
	},
	"cross_entropy": func(ad *adBuilder, v, dy *ir.Value) []*ir.Value {
		return []*ir.Value{ad.op("cross_entropy_grad", nil, v.Args[0], v.Args[1], dy), nil}
	},
	"cast": func(ad *adBuilder, v, dy *ir.Value) []*ir.Value {
		return []*ir.Value{ad.op("cast", ir.Attrs{"to": v.Args[0].Type.DType.String()}, dy)}
	},
}

func allAxes(n int) []int {
	axes := make([]int, n)
	for i := range axes {
		axes[i] = i
	}
	return axes
}

func reshape(ad *adBuilder, x *ir.Value, shape ir.Shape) *ir.Value {
	if x == nil || x.Type.Shape.Equal(shape) {
		return x
	}
	return ad.op("reshape", ir.Attrs{"shape": []int(shape.Clone())}, x)
}

// unbroadcast sums dy over the dims a broadcast to dy's shape expanded,
// giving a gradient of shape to.
func unbroadcast(ad *adBuilder, dy *ir.Value, to ir.Shape) *ir.Value {
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
	return reshape(ad, ad.op("reduce_sum", ir.Attrs{"axes": axes}, dy), to)
}

// expandReduced broadcasts the gradient of a reduction back to its input.
func expandReduced(ad *adBuilder, dy, v *ir.Value) *ir.Value {
	x := v.Args[0]
	kept := ir.ReducedShape(x.Type.Shape, v.Attrs.Ints("axes"), true)
	return ad.op("broadcast", ir.Attrs{"shape": []int(x.Type.Shape.Clone())}, reshape(ad, dy, kept))
}

func vjpTranspose(ad *adBuilder, v, dy *ir.Value) []*ir.Value {
	perm := v.Attrs.Ints("perm")
	inv := make([]int, len(perm))
	for i, p := range perm {
		inv[p] = i
	}
	return []*ir.Value{ad.op("transpose", ir.Attrs{"perm": inv}, dy)}
}

func mm(ad *adBuilder, a, b *ir.Value, ta, tb bool) *ir.Value {
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
	return ad.op("matmul", attrs, a, b)
}

// vjpMatMul differentiates Y = op(A)·op(B), where op transposes the last two
// dims when transA/transB is set: dA = dY·op(B)ᵀ and dB = op(A)ᵀ·dY, each
// arranged so the result comes out in the operand's stored layout. A shared
// 2-D B used with a batched A gets its gradient summed over the batch by
// folding the batch into the rows.
func vjpMatMul(ad *adBuilder, v, dy *ir.Value) []*ir.Value {
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
		da = ad.op("transpose", ir.Attrs{"perm": perm}, mm(ad, dy, b, false, !tb))
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
			a = ad.op("transpose", ir.Attrs{"perm": perm}, a)
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
