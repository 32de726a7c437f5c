package cpu_test

import (
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

// blockedCase is one collective over a dim split in fused blocks: the
// global shape, the split dim and its block count, and the mesh axis.
type blockedCase struct {
	mesh   string // e.g. "dp=2,tp=4"
	axis   string
	shape  []int
	dim    int
	blocks int
	dtype  string
}

func (c blockedCase) String() string {
	return fmt.Sprintf("%s_%s_%v_dim%d_x%d_%s", c.mesh, c.axis, c.shape, c.dim, c.blocks, c.dtype)
}

// split is the case's placement on its axis, e.g. S(1)x3 (S(1) for one
// block).
func (c blockedCase) split() string {
	if c.blocks > 1 {
		return fmt.Sprintf("S(%d)x%d", c.dim, c.blocks)
	}
	return fmt.Sprintf("S(%d)", c.dim)
}

var blockedCases = []blockedCase{
	{"tp=2", "tp", []int{2, 12, 3}, 1, 3, "f64"},
	{"tp=4", "tp", []int{2, 12, 3}, 1, 3, "f64"},
	{"tp=2", "tp", []int{8, 3}, 0, 2, "f64"},
	{"tp=4", "tp", []int{8, 3}, 0, 2, "f32"},
	{"tp=4", "tp", []int{3, 2, 24}, 2, 3, "f32"},
	{"tp=2", "tp", []int{4, 6}, 1, 1, "f64"}, // plain split, the path blocks must not disturb
	{"dp=2,tp=2", "tp", []int{2, 12}, 1, 3, "f64"},
	{"dp=4,tp=2", "dp", []int{3, 24}, 1, 3, "f64"},
}

// shardOf is the shard one device holds of a whole tensor split on dim in
// `blocks` fused blocks over n devices, written out index by index: local
// index j along dim is entry j%w of the device's slice of block j/w,
// where w = size/(blocks·n). It shares no code with the runtime.
func shardOf(x []float64, shape []int, dim, blocks, n, pos int) []float64 {
	size := shape[dim]
	w := size / (blocks * n)
	local := append([]int(nil), shape...)
	local[dim] = size / n
	total := 1
	for _, s := range local {
		total *= s
	}
	out := make([]float64, total)
	idx := make([]int, len(local))
	for i := range out {
		g := 0
		for d := range shape {
			c := idx[d]
			if d == dim {
				c = (c/w)*(size/blocks) + pos*w + c%w
			}
			g = g*shape[d] + c
		}
		out[i] = x[g]
		for d := len(local) - 1; d >= 0; d-- {
			idx[d]++
			if idx[d] < local[d] {
				break
			}
			idx[d] = 0
		}
	}
	return out
}

// randomWhole is a tensor of small integers, so sums of them are exact in
// any order and any float type.
func randomWhole(rng *rand.Rand, n int) []float64 {
	x := make([]float64, n)
	for i := range x {
		x[i] = float64(rng.IntN(201) - 100)
	}
	return x
}

func elements(shape []int) int {
	n := 1
	for _, s := range shape {
		n *= s
	}
	return n
}

// loadCollective lowers a module that applies one collective to state
// "in" and stores the result in state "out", and loads it on every
// device of the mesh.
func loadCollective(t *testing.T, c blockedCase, op, inPlace, outPlace string) (*cpu.Cluster, *lower.Program) {
	t.Helper()
	typ := fmt.Sprintf("%s%v", c.dtype, strings.ReplaceAll(fmt.Sprint(c.shape), " ", ","))
	axes := strings.Split(c.mesh, ",")
	places := func(p string) string {
		var out []string
		for _, a := range axes {
			if strings.HasPrefix(a, c.axis+"=") {
				out = append(out, p)
			} else {
				out = append(out, "R")
			}
		}
		return strings.Join(out, ",")
	}
	blocks := ""
	if c.blocks > 1 {
		blocks = fmt.Sprintf(" blocks=%d", c.blocks)
	}
	text := fmt.Sprintf(`gir 1
module "blocked"
mesh %s
%%0 = state : %s {name="in" place=[%s]} @model.go:1
%%1 = state : %s {name="out" place=[%s]} @model.go:2
%%2 = %s %%0 : %s {axis=%q%s dim=%d place=[%s]} @model.go:3
update %%1 = %%2
`, c.mesh, typ, places(inPlace), typ, places(outPlace), op, typ, c.axis, blocks, c.dim, places(outPlace))
	m, err := ir.Parse("blocked.gir", text)
	require.NoError(t, err)
	require.NoError(t, ir.Verify(m, ""))
	prog, err := lower.Lower(m)
	require.NoError(t, err)
	cl, err := cpu.NewCluster(prog, cpu.Options{})
	require.NoError(t, err)
	return cl, prog
}

// axisPos is a device's coordinate on the collective's axis and the
// axis size (the last mesh axis varies fastest).
func axisPos(t *testing.T, prog *lower.Program, axis string, rank int) (pos, n int) {
	ax := prog.Mesh.Axis(axis)
	require.GreaterOrEqual(t, ax, 0)
	return prog.Mesh.Coords(rank)[ax], prog.Mesh.Axes[ax].Size
}

// all_gather of a blocked split gives every device the whole tensor when
// each holds the shard the layout assigns it.
func TestBlockedAllGather(t *testing.T) {
	for i, c := range blockedCases {
		t.Run(c.String(), func(t *testing.T) {
			cl, prog := loadCollective(t, c, "all_gather", c.split(), "R")
			whole := randomWhole(rand.New(rand.NewPCG(uint64(i), 1)), elements(c.shape))
			for r, d := range cl.Devices {
				pos, n := axisPos(t, prog, c.axis, r)
				require.NoError(t, d.SetFloat64s("in", shardOf(whole, c.shape, c.dim, c.blocks, n, pos)))
			}
			require.NoError(t, cl.Step())
			for r, d := range cl.Devices {
				got, err := d.Float64s("out")
				require.NoError(t, err)
				assert.Equal(t, whole, got, "device %d", r)
			}
		})
	}
}

// reduce_scatter into a blocked split leaves on each device its shard of
// the sum of every device's whole tensor.
func TestBlockedReduceScatter(t *testing.T) {
	for i, c := range blockedCases {
		t.Run(c.String(), func(t *testing.T) {
			cl, prog := loadCollective(t, c, "reduce_scatter", "P", c.split())
			rng := rand.New(rand.NewPCG(uint64(i), 2))
			sums := map[string][]float64{} // per group: the devices sharing every other coordinate
			group := func(r int) string {
				co := prog.Mesh.Coords(r)
				co[prog.Mesh.Axis(c.axis)] = -1
				return fmt.Sprint(co)
			}
			for r, d := range cl.Devices {
				part := randomWhole(rng, elements(c.shape))
				require.NoError(t, d.SetFloat64s("in", part))
				s := sums[group(r)]
				if s == nil {
					s = make([]float64, len(part))
					sums[group(r)] = s
				}
				for k := range part {
					s[k] += part[k]
				}
			}
			require.NoError(t, cl.Step())
			for r, d := range cl.Devices {
				pos, n := axisPos(t, prog, c.axis, r)
				got, err := d.Float64s("out")
				require.NoError(t, err)
				assert.Equal(t, shardOf(sums[group(r)], c.shape, c.dim, c.blocks, n, pos), got, "device %d", r)
			}
		})
	}
}

// shard_slice into a blocked split keeps on each device its shard of the
// whole tensor, with no communication.
func TestBlockedShardSlice(t *testing.T) {
	for i, c := range blockedCases {
		t.Run(c.String(), func(t *testing.T) {
			cl, prog := loadCollective(t, c, "shard_slice", "R", c.split())
			whole := randomWhole(rand.New(rand.NewPCG(uint64(i), 3)), elements(c.shape))
			for _, d := range cl.Devices {
				require.NoError(t, d.SetFloat64s("in", whole))
			}
			before := cl.Comm.Stats()
			require.NoError(t, cl.Step())
			assert.Equal(t, before, cl.Comm.Stats(), "slicing moves nothing between devices")
			for r, d := range cl.Devices {
				pos, n := axisPos(t, prog, c.axis, r)
				got, err := d.Float64s("out")
				require.NoError(t, err)
				assert.Equal(t, shardOf(whole, c.shape, c.dim, c.blocks, n, pos), got, "device %d", r)
			}
		})
	}
}

// Gathering and slicing back is the identity on every device's shard,
// and the fused layout differs from the plain one (so the tests above
// would notice a collective that ignored the blocks).
func TestBlockedLayoutIsNotThePlainOne(t *testing.T) {
	c := blockedCases[0]
	whole := randomWhole(rand.New(rand.NewPCG(9, 9)), elements(c.shape))
	assert.NotEqual(t, shardOf(whole, c.shape, c.dim, 1, 2, 1), shardOf(whole, c.shape, c.dim, c.blocks, 2, 1))
}

// A program whose collective names a split its buffers cannot have is a
// load error naming the instruction, not a panic or a wrong copy.
func TestBlockedCollectiveWithBadBlocksFailsToLoad(t *testing.T) {
	for _, tt := range []struct {
		blocks any
		dim    int
	}{{5, 1}, {0, 1}, {3, 4}, {3, -1}, {3, 0}} {
		t.Run(fmt.Sprint(tt), func(t *testing.T) {
			c := blockedCase{"tp=2", "tp", []int{2, 12, 3}, 1, 3, "f64"}
			_, prog := loadCollective(t, c, "all_gather", "S(1)x3", "R")
			found := false
			for i, in := range prog.Instrs {
				if in.Op == "all_gather" {
					attrs := ir.Attrs{}
					for k, v := range in.Attrs {
						attrs[k] = v
					}
					attrs["blocks"], attrs["dim"] = tt.blocks, tt.dim
					prog.Instrs[i].Attrs = attrs
					found = true
				}
			}
			require.True(t, found)
			_, err := cpu.NewCluster(prog, cpu.Options{})
			require.Error(t, err)
			assert.Contains(t, err.Error(), "all_gather on dim")
			assert.Contains(t, err.Error(), "have no such split")
		})
	}
}
