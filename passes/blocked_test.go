package passes_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/ir"
	"gcompile/passes"
)

// step is one collective the redistribute pass emits: its op and the
// attributes that say what it moves.
type step struct {
	op     string
	axis   string
	dim    int
	blocks int // 0: no blocks attribute
}

// A placement split in fused blocks converts with collectives that carry
// the block count, so each device moves its slice of every block; plain
// splits keep their attribute-free form, and a re-split of blocks (which
// no sharding rule asks for) is refused by name instead of mixing blocks.
func TestRedistributeBlockedConversions(t *testing.T) {
	cases := []struct {
		name     string
		from, to string
		want     []step
		err      string
	}{
		{"gather fused columns", "R,S(1)x3", "R,R", []step{{"all_gather", "tp", 1, 3}}, ""},
		{"gather fused rows", "R,S(0)x2", "R,R", []step{{"all_gather", "tp", 0, 2}}, ""},
		{"slice into fused columns", "R,R", "R,S(1)x3", []step{{"shard_slice", "tp", 1, 3}}, ""},
		{"reduce-scatter into fused columns", "R,P", "R,S(1)x3", []step{{"reduce_scatter", "tp", 1, 3}}, ""},
		{"ZeRO rows and fused columns gathered", "S(0),S(1)x3", "R,R", []step{{"all_gather", "dp", 0, 0}, {"all_gather", "tp", 1, 3}}, ""},
		{"reduce on dp, gather fused on tp", "P,S(1)x3", "R,R", []step{{"all_reduce", "dp", 0, 0}, {"all_gather", "tp", 1, 3}}, ""},
		{"slice both, fused on tp", "R,R", "S(0),S(1)x3", []step{{"shard_slice", "dp", 0, 0}, {"shard_slice", "tp", 1, 3}}, ""},
		{"plain split stays plain", "R,S(1)", "R,R", []step{{"all_gather", "tp", 1, 0}}, ""},
		{"fused blocks to another dim", "R,S(1)x3", "R,S(0)", nil, "no conversion from S(1)x3 to S(0) on axis tp"},
		{"fused blocks to a plain split of the dim", "R,S(1)x3", "R,S(1)", nil, "no conversion from S(1)x3 to S(1) on axis tp"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			// The header records every pass through shard, so the run
			// resumes at redistribute.
			text := "gir 1\nmodule \"m\"\npasses " + strings.Join(through("shard"), ",") + "\nmesh dp=2,tp=2\n" +
				fmt.Sprintf("%%0 = state : f32[4,12] {name=\"a\" place=[%s]} @model.go:10\n", c.from) +
				fmt.Sprintf("%%1 = redistribute %%0 : f32[4,12] {place=[%s] phase=opt} @model.go:11\n", c.to)
			m, err := ir.Parse("blocked.gir", text)
			require.NoError(t, err)
			require.NoError(t, ir.Verify(m, "shard"))
			o := passes.DefaultOptions()
			o.Verify = true
			o.StopAfter = "redistribute"
			_, err = passes.Run(m, o, passes.Hooks{})
			if c.err != "" {
				require.Error(t, err)
				assert.ErrorIs(t, err, passes.ErrNotYet)
				assert.Contains(t, err.Error(), c.err)
				assert.Contains(t, err.Error(), "@model.go:11", "the error names the user's line")
				return
			}
			require.NoError(t, err)
			var got []step
			for _, v := range m.Values[1:] {
				s := step{op: v.Op, axis: v.Attrs.Str("axis"), dim: v.Attrs.Int("dim", 0)}
				if b, ok := v.Attrs["blocks"]; ok {
					s.blocks = b.(int)
				}
				got = append(got, s)
			}
			assert.Equal(t, c.want, got)
			last := m.Values[len(m.Values)-1]
			assert.Equal(t, 1, last.ID, "the last collective keeps the redistribute's id")
			assert.Equal(t, "["+c.to+"]", ir.PlacementString(last.Place))
			// Blocks are printed only where a dim is fused, and the text
			// round-trips.
			printed := ir.Print(m)
			assert.Equal(t, strings.Count(c.from+c.to, "x"), strings.Count(printed, "blocks="), printed)
			back, err := ir.Parse("blocked.gir", printed)
			require.NoError(t, err)
			assert.Equal(t, printed, ir.Print(back))
		})
	}
}

// blockedPlan is one placement of the tiny GPT whose fused q,k,v weight
// (S(1)x3 on tp) meets an optimizer.
type blockedPlan struct {
	optimizer string
	dp, tp    int
	zero      int
	sp        bool
}

func (p blockedPlan) String() string {
	return fmt.Sprintf("%s/dp%d_tp%d_zero%d_sp%v", p.optimizer, p.dp, p.tp, p.zero, p.sp)
}

func compileBlocked(t *testing.T, p blockedPlan) *ir.Module {
	t.Helper()
	m := buildShardGPT(t, 8)
	o := passes.DefaultOptions()
	o.Verify = true
	o.Optimizer = p.optimizer
	o.Zero = p.zero
	o.SequenceParallel = p.sp
	o.Mesh = &ir.Mesh{}
	if p.dp > 1 {
		o.Mesh.Axes = append(o.Mesh.Axes, ir.MeshAxis{Name: "dp", Size: p.dp})
	}
	o.Mesh.Axes = append(o.Mesh.Axes, ir.MeshAxis{Name: "tp", Size: p.tp})
	_, err := passes.Run(m, o, passes.Hooks{})
	require.NoError(t, err, "%v", p)
	return m
}

// isBlockedOn reports whether v is op on the tp axis over dim in k blocks.
func isBlockedOn(v *ir.Value, op string, dim, k int) bool {
	return v.Op == op && v.Attrs.Str("axis") == "tp" && v.Attrs.Int("dim", -1) == dim && v.Attrs.Int("blocks", 1) == k
}

// gatheredFrom follows a chain of all_gathers back to the value they
// gather and reports whether one of them joined the tp blocks of dim.
func gatheredFrom(v *ir.Value, dim int) (src *ir.Value, blocked bool) {
	for v.Op == "all_gather" {
		blocked = blocked || isBlockedOn(v, "all_gather", dim, 3)
		v = v.Args[0]
	}
	return v, blocked
}

// Adafactor's and SM3's factored updates need the fused q,k,v weight
// whole: it and its gradient are gathered block by block (all_gather with
// blocks=3 on tp) and the new weight is sliced back the same way, under
// plain tp, with sequence parallelism and with ZeRO on dp. Adafactor's
// RMS needs the fused bias and its accumulator whole too; SM3 updates a
// vector entry by entry, on its shards. Every plan verifies after every
// pass, and none needs an all_to_all.
func TestFusedBlocksGatheredForFactoredUpdates(t *testing.T) {
	var plans []blockedPlan
	for _, opt := range []string{"adafactor", "sm3"} {
		plans = append(plans, blockedPlan{opt, 1, 2, 0, false}, blockedPlan{opt, 1, 4, 0, false}, blockedPlan{opt, 1, 2, 0, true},
			blockedPlan{opt, 2, 2, 1, false}, blockedPlan{opt, 2, 2, 2, true}, blockedPlan{opt, 2, 2, 3, false})
	}
	for _, p := range plans {
		t.Run(p.String(), func(t *testing.T) {
			m := compileBlocked(t, p)
			updates := map[string]*ir.Value{}
			for _, u := range m.Updates {
				updates[u.State.Name()] = u.Value
			}
			for _, v := range m.Values {
				assert.NotEqual(t, "all_to_all", v.Op, "%s", v.Where())
			}

			w := "h.0.attn.c_attn.weight"
			// The new weight reaches the param through slices (one per
			// axis it is split on, the tp one blocked) of the update.
			upd := updates[w]
			require.NotNil(t, upd, w)
			blockedSlice := false
			for upd.Op == "shard_slice" {
				blockedSlice = blockedSlice || isBlockedOn(upd, "shard_slice", 1, 3)
				upd = upd.Args[0]
			}
			assert.True(t, blockedSlice, "%s is sliced back block by block", w)
			require.Equal(t, p.optimizer, upd.Op, "the slices take the update's result")
			param, blocked := gatheredFrom(upd.Args[0], 1)
			assert.True(t, blocked, "%s gathered block by block", w)
			assert.Equal(t, w, param.Name())
			// The gradient is split on tp like the weight (ZeRO-3 gathers
			// the weight over dp only), and gathered block by block.
			_, blocked = gatheredFrom(upd.Args[1], 1)
			assert.True(t, blocked, "the gradient gathered block by block")
			assert.Equal(t, ir.PlacementString(ir.Replicated(m.Mesh)), ir.PlacementString(upd.Args[1].Place), "the gradient is whole")
			assert.Equal(t, "[R]", ir.PlacementString(upd.Place[len(upd.Place)-1:]), "the update runs whole on tp")

			b := "h.0.attn.c_attn.bias"
			bupd := updates[b]
			require.NotNil(t, bupd, b)
			if p.optimizer == "adafactor" {
				require.True(t, isBlockedOn(bupd, "shard_slice", 0, 3), "%s: got %s %v", b, bupd.Op, bupd.Attrs)
				require.Equal(t, "adafactor_vec", bupd.Args[0].Op)
				acc := updates["adafactor.v/"+b]
				require.NotNil(t, acc)
				require.True(t, isBlockedOn(acc, "shard_slice", 0, 3), "the accumulator slices back too")
				state, blocked := gatheredFrom(acc.Args[0].Args[0], 0)
				assert.True(t, blocked)
				assert.Equal(t, "adafactor.v/"+b, state.Name())
			} else {
				require.Equal(t, "sm3_vec", bupd.Op, "SM3 updates a fused vector in place on its shards")
				assert.Equal(t, "S(0)x3", bupd.Place[len(bupd.Place)-1].String())
			}
		})
	}
}

// Under ZeRO-3 a fused weight is gathered over dp only for its uses, so
// its tensor-parallel blocks stay where they are: AdamW and SGD, which
// update element by element, need no blocked collective at all (before,
// ZeRO-3 gathered params over tp as well and sliced them back after the
// update), and the plan compiles and verifies.
func TestZeRO3GathersFusedBlocks(t *testing.T) {
	for _, opt := range []string{"adamw", "sgd"} {
		t.Run(opt, func(t *testing.T) {
			m := compileBlocked(t, blockedPlan{opt, 2, 2, 3, false})
			gathers, blocked := 0, 0
			for _, v := range m.Values {
				if v.Op == "all_gather" && v.Attrs.Str("axis") == "dp" && v.Meta.Phase != ir.PhaseOpt {
					gathers++
				}
				if v.Attrs.Int("blocks", 1) > 1 {
					blocked++
				}
			}
			assert.Positive(t, gathers, "ZeRO-3 gathers params over dp for their uses")
			assert.Zero(t, blocked, "no collective over tp's fused blocks")
		})
	}
}
