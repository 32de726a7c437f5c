package frontend

import (
	"errors"
	"fmt"
	"math"
	"slices"

	"gcompile/ir"
)

// Generation is how a model is built when it is compiled for generation
// rather than training: one step of Step tokens per sequence (a prompt's
// at prefill, one at decode) against a key/value cache of Context
// positions per sequence.
//
// The model's code is the same as for training; the DSL records other
// ops where training's assume that a token's position is its row:
//   - Sequence returns Step, so the tokens input is [batch, Step];
//   - Positions is an input, each token's absolute position, fed by the
//     runtime (RoPE, PositionEmbedding and Attention read it);
//   - every causal Attention writes its keys and values into a cache
//     state of its own (kv_write) and attends over the cache
//     (attention_at) up to each query's position;
//   - the logits the loss reads (Tensor.CrossEntropy's first argument)
//     are the module's one output, "logits"; the loss and everything only
//     it needs are dropped.
//
// At a step of more than one token (a prefill) only each sequence's last
// prompt token's logits are sampled from, so the head computes those
// alone unless EveryRow is set (see lastTokenLogits).
type Generation struct {
	Step    int
	Context int
	// EveryRow keeps a prefill's logits for every token of the step,
	// [batch·step, vocab]: what a check of every position, or a score of
	// the whole prompt, reads.
	EveryRow bool
}

// Generating reports whether the model is being built for generation
// (Config.Generate).
func (b *Builder) Generating() bool { return b.cfg.Generate != nil }

// Sequence reads the sequence length the model trains on, --set seq
// (default def). When the model is built for generation it returns the
// tokens of one step instead; TrainedSequence still gives the trained
// length (the rows of a learned position table, say).
func (b *Builder) Sequence(def int) int {
	seq := b.Int("seq", def, "sequence length")
	b.trainedSeq = seq
	if g := b.cfg.Generate; g != nil {
		return g.Step
	}
	return seq
}

// TrainedSequence is the sequence length the model trains on, as
// Sequence read it: the same whether or not the model is being built for
// generation.
func (b *Builder) TrainedSequence() int { return b.trainedSeq }

// Positions is each token's absolute position in its sequence,
// i32[batch, step], when the model is built for generation: a batch input
// the runtime feeds every step. Outside generation a token's position is
// its row, and Positions is an error.
func (b *Builder) Positions() *Tensor {
	g := b.cfg.Generate
	if g == nil {
		b.fail(userPos(), errors.New("Positions: a token's position is an input only when the model is built for generation (see Builder.Generating)"))
		return &Tensor{b: b}
	}
	if b.positions == nil {
		b.positions = b.Input(ir.PositionsInput, ir.I32, b.cfg.Batch, g.Step)
	}
	return b.positions
}

// cachedAttention is Attention when generating: k and v are appended to
// this layer's caches at the step's positions, and q attends over each
// cache up to its own position.
func (t *Tensor) cachedAttention(k, v *Tensor, causal bool, scale float64) *Tensor {
	b := t.b
	if t.v == nil || k.v == nil || v.v == nil {
		return &Tensor{b: b}
	}
	if !causal {
		b.fail(userPos(), errors.New("attention: generation caches the keys of causal attention only; this attention is not causal"))
		return &Tensor{b: b}
	}
	if k.v.Type.Rank() != 4 || !k.v.Type.Equal(v.v.Type) {
		b.fail(userPos(), fmt.Errorf("attention: k %v and v %v must be [batch, kv_heads, step, head_dim] alike to be cached", k.v.Type, v.v.Type))
		return &Tensor{b: b}
	}
	pos := b.Positions()
	s := k.Shape()
	cacheType := ir.T(k.v.Type.DType, s[0], s[1], b.cfg.Generate.Context, s[3])
	layer := b.caches
	b.caches++
	write := func(x *Tensor, which string) *Tensor {
		c := b.source("state", cacheType, ir.Attrs{"name": fmt.Sprintf("%s%d.%s", ir.KVCachePrefix, layer, which)})
		w := c.op("kv_write", nil, x, pos)
		if c.v != nil && w.v != nil {
			b.m.Updates = append(b.m.Updates, ir.Update{State: c.v, Value: w.v})
		}
		return w
	}
	kc, vc := write(k, "k"), write(v, "v")
	return t.op("attention_at", ir.Attrs{"scale": scale}, kc, vc, pos)
}

// finishGeneration makes the module's one output the logits the loss
// read and drops what only the loss needed.
func (b *Builder) finishGeneration() {
	if b.logits == nil {
		if len(b.errs) == 0 {
			b.report(errors.New("model did not call CrossEntropy(…): generation needs the logits the loss reads"))
		}
		return
	}
	if b.caches == 0 && len(b.errs) == 0 {
		b.report(errors.New("model has no causal attention: there are no keys and values to cache, and generation would see one token at a time"))
		return
	}
	logits := b.logits
	if g := b.cfg.Generate; g.Step > 1 && !g.EveryRow {
		logits = b.lastTokenLogits(logits)
	}
	b.m.Outputs = []ir.Output{{Name: ir.OutputLogits, Value: logits}}
	b.m.DropDead()
}

// lastTokenLogits makes a prefill's head compute the logits of each
// sequence's last prompt token alone, the only ones sampled from: the
// head's matmul and what follows it otherwise cost batch·step·vocab
// (with a 150k vocabulary, more than the layers of a small model, and
// the largest buffer of the step). The hidden rows the head reads,
// [batch·step, hidden], are narrowed to [batch, hidden] by a batched
// matmul with the InputLastToken mask (exact: one product by 1, the rest
// by 0), and the ops from the head to the logits are recorded again on
// the narrowed rows.
//
// The walk from the logits back to the head goes through ops that keep
// rows apart: reshapes of the leading dims, and elementwise ops, casts
// and scales whose other operands are the same for every row (a
// scalar, a broadcast row such as the vocabulary mask). A head of
// another form keeps every row, as before; the runtime reads the
// logits' shape either way. Rows are taken batch-major (row b·step+i is
// sequence b's token i), as the engine has always read the logits: a
// model that lays its tokens out sequence-major would give the engine
// other rows either way.
func (b *Builder) lastTokenLogits(logits *ir.Value) *ir.Value {
	batch, step := b.cfg.Batch, b.cfg.Generate.Step
	rows := batch * step
	type link struct {
		v   *ir.Value
		arg int // the argument that carries the rows (rowArg)
	}
	var chain []link
	head := logits
	for head.Op != "matmul" {
		if leadingRows(head.Type) != rows {
			return logits
		}
		i := rowArg(head, rows)
		if i < 0 {
			return logits
		}
		chain = append(chain, link{head, i})
		head = head.Args[i]
	}
	x, w := head.Args[0], head.Args[1]
	switch {
	case head.Attrs.Bool("transA") || w.Type.Rank() != 2 || x.Type.Rank() < 2 || x.Type.Rank() > 3 || leadingRows(x.Type) != rows:
		return logits
	case x.Type.Rank() == 3 && (x.Type.Shape[0] != batch || x.Type.Shape[1] != step):
		return logits
	}
	hidden := x.Type.Shape[x.Type.Rank()-1]
	add := func(op string, attrs ir.Attrs, like *ir.Value, args ...*ir.Value) *ir.Value {
		if slices.Contains(args, nil) {
			return nil // an earlier op's error is reported
		}
		v, err := b.m.Add(op, args, attrs, like.Meta, like.Pos)
		if err != nil {
			b.report(fmt.Errorf("the prefill's last-token logits: %w", err))
		}
		return v
	}
	in, err := b.m.AddSource("input", ir.T(ir.I32, batch, step), ir.Attrs{"name": ir.InputLastToken}, b.sourceMeta("input"), head.Pos)
	if err != nil {
		b.report(fmt.Errorf("the prefill's last-token logits: %w", err))
		return logits
	}
	mask := add("reshape", ir.Attrs{"shape": []int{batch, 1, step}}, head, add("cast", ir.Attrs{"to": x.Type.DType.String()}, head, in))
	x3 := x
	if x.Type.Rank() == 2 {
		x3 = add("reshape", ir.Attrs{"shape": []int{batch, step, hidden}}, head, x)
	}
	if mask == nil || x3 == nil {
		return logits
	}
	last := add("reshape", ir.Attrs{"shape": []int{batch, hidden}}, head, add("matmul", nil, head, mask, x3))
	cur := add("matmul", head.Attrs.Clone(), head, last, w)
	for i := len(chain) - 1; i >= 0 && cur != nil; i-- {
		c := chain[i].v
		if c.Op == "reshape" {
			continue // cur keeps [batch, vocab]
		}
		args := make([]*ir.Value, len(c.Args))
		for j, a := range c.Args {
			switch {
			case j == chain[i].arg:
				args[j] = cur
			case a.Op == "broadcast":
				args[j] = add("broadcast", ir.Attrs{"shape": []int(cur.Type.Shape.Clone())}, a, a.Args[0])
			default:
				args[j] = a // a scalar
			}
		}
		cur = add(c.Op, c.Attrs.Clone(), c, args...)
	}
	if cur == nil {
		return logits
	}
	return cur
}

// leadingRows is the product of t's dims but the last: the rows a
// per-token op keeps apart.
func leadingRows(t ir.Type) int {
	n := 1
	for _, d := range t.Shape[:max(t.Rank()-1, 0)] {
		n *= d
	}
	return n
}

// rowArg is the argument of v that carries its rows, when v keeps rows
// apart: a reshape of the leading dims alone, or an elementwise op, cast
// or scale whose other arguments are scalars or broadcasts of one row.
// It is −1 for any other op.
func rowArg(v *ir.Value, rows int) int {
	if v.Op == "reshape" {
		a := v.Args[0].Type
		if a.Rank() >= 1 && v.Type.Rank() >= 1 && a.Shape[a.Rank()-1] == v.Type.Shape[v.Type.Rank()-1] && leadingRows(a) == rows {
			return 0
		}
		return -1
	}
	info, ok := ir.Lookup(v.Op)
	if !ok || !(info.Elementwise || v.Op == "cast" || v.Op == "scale") || v.Op == ir.FusedOp {
		return -1
	}
	at := -1
	for j, a := range v.Args {
		switch {
		case a.Type.Rank() == 0:
		case a.Op == "broadcast" && leadingRows(a.Args[0].Type) == 1 && a.Args[0].Type.Rank() <= 2:
			// One row, of a rank that broadcasts to [batch, vocab].
		case a.Type.Shape.Equal(v.Type.Shape) && at < 0:
			at = j
		default:
			return -1
		}
	}
	return at
}

// checkGeneration refuses sizes no cache can hold before the model runs.
func checkGeneration(g *Generation) error {
	if g == nil {
		return nil
	}
	if g.Step < 1 || g.Context < g.Step || g.Context > math.MaxInt32 {
		return fmt.Errorf("generation: a step of %d tokens against a cache of %d positions: want 1 ≤ step ≤ context < 2^31", g.Step, g.Context)
	}
	return nil
}
