package cpu_test

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/ir"
	"gcompile/lower"
	"gcompile/runtime/cpu"
)

// allToAllCase re-splits a tensor of shape from dim from to dim to over
// the mesh axis.
type allToAllCase struct {
	mesh, axis string
	shape      []int
	from, to   int
	dtype      string
}

func (c allToAllCase) String() string {
	return fmt.Sprintf("%s_%s_%v_%d_to_%d_%s", c.mesh, c.axis, c.shape, c.from, c.to, c.dtype)
}

// loadAllToAll lowers state "in" (split on from) → all_to_all → state
// "out" (split on to) and loads it on every device of the mesh.
func loadAllToAll(t *testing.T, c allToAllCase) (*cpu.Cluster, *lower.Program) {
	t.Helper()
	typ := fmt.Sprintf("%s%v", c.dtype, strings.ReplaceAll(fmt.Sprint(c.shape), " ", ","))
	places := func(dim int) string {
		var out []string
		for _, a := range strings.Split(c.mesh, ",") {
			if strings.HasPrefix(a, c.axis+"=") {
				out = append(out, fmt.Sprintf("S(%d)", dim))
			} else {
				out = append(out, "R")
			}
		}
		return strings.Join(out, ",")
	}
	text := fmt.Sprintf(`gir 1
module "a2a"
mesh %s
%%0 = state : %s {name="in" place=[%s]} @model.go:1
%%1 = state : %s {name="out" place=[%s]} @model.go:2
%%2 = all_to_all %%0 : %s {axis=%q from=%d to=%d place=[%s]} @model.go:3
update %%1 = %%2
`, c.mesh, typ, places(c.from), typ, places(c.to), typ, c.axis, c.from, c.to, places(c.to))
	m, err := ir.Parse("a2a.gir", text)
	require.NoError(t, err)
	require.NoError(t, ir.Verify(m, ""))
	prog, err := lower.Lower(m)
	require.NoError(t, err)
	cl, err := cpu.NewCluster(prog, cpu.Options{})
	require.NoError(t, err)
	return cl, prog
}

// all_to_all leaves on each device its shard of the tensor split on the
// new dim, given its shard of the tensor split on the old one.
func TestAllToAll(t *testing.T) {
	for i, c := range []allToAllCase{
		{"tp=2", "tp", []int{4, 6}, 0, 1, "f64"},
		{"tp=2", "tp", []int{6, 4}, 1, 0, "f32"},
		{"tp=4", "tp", []int{4, 8, 2}, 0, 1, "f32"},
		{"tp=3", "tp", []int{2, 3, 6}, 2, 1, "f64"},
		{"dp=2,tp=2", "tp", []int{2, 4, 6}, 2, 0, "f64"},
		{"dp=2,tp=2", "dp", []int{4, 2}, 0, 1, "f32"},
	} {
		t.Run(c.String(), func(t *testing.T) {
			cl, prog := loadAllToAll(t, c)
			whole := randomWhole(rand.New(rand.NewPCG(uint64(i), 4)), elements(c.shape))
			for r, d := range cl.Devices {
				pos, n := axisPos(t, prog, c.axis, r)
				require.NoError(t, d.SetFloat64s("in", shardOf(whole, c.shape, c.from, 1, n, pos)))
			}
			require.NoError(t, cl.Step())
			for r, d := range cl.Devices {
				pos, n := axisPos(t, prog, c.axis, r)
				got, err := d.Float64s("out")
				require.NoError(t, err)
				assert.Equal(t, shardOf(whole, c.shape, c.to, 1, n, pos), got, "device %d", r)
			}
		})
	}
}

// all_to_all only moves elements, so i32 values (token ids) are re-split
// exactly, bit for bit.
func TestAllToAllMovesInt32Bits(t *testing.T) {
	c := allToAllCase{"tp=2", "tp", []int{4, 6}, 0, 1, "i32"}
	cl, prog := loadAllToAll(t, c)
	whole := make([]float64, elements(c.shape))
	for k := range whole {
		whole[k] = float64(1<<30 + 7*k) // beyond float32's exact integers
	}
	ints := func(x []float64) []int32 {
		out := make([]int32, len(x))
		for k, v := range x {
			out[k] = int32(v)
		}
		return out
	}
	for r, d := range cl.Devices {
		pos, n := axisPos(t, prog, c.axis, r)
		require.NoError(t, d.SetInt32("in", ints(shardOf(whole, c.shape, c.from, 1, n, pos))))
	}
	require.NoError(t, cl.Step())
	for r, d := range cl.Devices {
		pos, n := axisPos(t, prog, c.axis, r)
		raw, typ, err := d.Bytes("out")
		require.NoError(t, err)
		require.Equal(t, ir.I32, typ.DType)
		got := make([]int32, len(raw)/4)
		for k := range got {
			got[k] = int32(binary.LittleEndian.Uint32(raw[4*k:]))
		}
		assert.Equal(t, ints(shardOf(whole, c.shape, c.to, 1, n, pos)), got, "device %d", r)
	}
}

// A program whose all_to_all names dims its buffers cannot be split on
// is a load error naming the instruction, not a panic or a wrong copy.
func TestAllToAllWithBadDimsFailsToLoad(t *testing.T) {
	for _, dims := range [][2]int{{0, 0}, {1, 0}, {0, 2}, {-1, 1}} {
		t.Run(fmt.Sprint(dims), func(t *testing.T) {
			_, prog := loadAllToAll(t, allToAllCase{"tp=2", "tp", []int{4, 6}, 0, 1, "f64"})
			found := false
			for i, in := range prog.Instrs {
				if in.Op == "all_to_all" {
					attrs := ir.Attrs{}
					for k, v := range in.Attrs {
						attrs[k] = v
					}
					attrs["from"], attrs["to"] = dims[0], dims[1]
					prog.Instrs[i].Attrs = attrs
					found = true
				}
			}
			require.True(t, found)
			_, err := cpu.NewCluster(prog, cpu.Options{})
			require.Error(t, err)
			assert.Contains(t, err.Error(), "all_to_all @model.go:3")
			assert.Contains(t, err.Error(), "have no such split")
		})
	}
}
