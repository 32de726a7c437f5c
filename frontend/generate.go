package frontend

import (
	"errors"
	"fmt"
	"math"

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
type Generation struct {
	Step    int
	Context int
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
	b.m.Outputs = []ir.Output{{Name: ir.OutputLogits, Value: b.logits}}
	b.m.DropDead()
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
