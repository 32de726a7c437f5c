package comm

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/ir"
	kcpu "gcompile/kernels/cpu"
	"gcompile/runtime"
)

// A 16-bit reduction (--grad-reduce-dtype bf16 or fp16) adds the members
// in group-position order, rounding each add to the format, on one
// process or several, and moves 2 bytes an element.
func TestSixteenBitSumsRoundEachAdd(t *testing.T) {
	const devices, n = 4, 1001
	g := runtime.Group{Ranks: []int{2, 0, 3, 1}}
	for _, dt := range []ir.DType{ir.BF16, ir.F16} {
		round, widen := kcpu.F16FromF32, kcpu.F32FromF16
		if dt == ir.BF16 {
			round, widen = kcpu.BF16FromF32, kcpu.F32FromBF16
		}
		rng := rand.New(rand.NewPCG(3, 4))
		ins := make([][]uint16, devices)
		for r := range ins {
			ins[r] = make([]uint16, n*devices)
			for i := range ins[r] {
				ins[r][i] = round(float32(rng.NormFloat64() * float64(int(1)<<(r*3))))
			}
		}
		// The sum in position order, rounded after each add.
		want := make([]uint16, n*devices)
		for i := range want {
			acc := ins[g.Ranks[0]][i]
			for _, r := range g.Ranks[1:] {
				acc = round(widen(acc) + widen(ins[r][i]))
			}
			want[i] = acc
		}
		var wide int
		for i := range want {
			sum := float32(0)
			for _, r := range g.Ranks {
				sum += widen(ins[r][i])
			}
			if round(sum) != want[i] {
				wide++
			}
		}
		require.Positive(t, wide, "%v: some sums must differ from one rounding of the float32 sum, or the test tells nothing", dt)

		local := NewLocal(devices)
		nets := newNets(t, devices, 2, 5*time.Second)
		for _, c := range []struct {
			name string
			of   func(rank int) runtime.Comm
		}{{"local", func(int) runtime.Comm { return local }}, {"net", func(r int) runtime.Comm { return netOf(nets, r) }}} {
			t.Run(fmt.Sprintf("%v/%s", dt, c.name), func(t *testing.T) {
				sums := make([][]uint16, g.Size())
				shards := make([][]uint16, g.Size())
				errs := runMembers(t, g, func(p, r int) error {
					sums[p] = append([]uint16(nil), ins[r]...)
					// Two buffers, one bucket.
					if err := c.of(r).AllReduce(g, r, dt, Bytes16(sums[p][:7]), Bytes16(sums[p][7:])); err != nil {
						return err
					}
					shards[p] = make([]uint16, n)
					return c.of(r).ReduceScatter(g, r, dt, Bytes16(ins[r]), Bytes16(shards[p]))
				})
				for p, err := range errs {
					require.NoError(t, err, "position %d", p)
					assert.Equal(t, want, sums[p], "all-reduce at position %d", p)
					assert.Equal(t, want[p*n:(p+1)*n], shards[p], "reduce-scatter at position %d", p)
				}
			})
		}
		st := local.Stats()
		assert.Equal(t, int64(2*(n*devices+n*devices)*devices), st.Bytes, "%v: 2 bytes an element, every member's operands", dt)
	}
}

// Bytes16 is x's memory as bytes, shared.
func Bytes16(x []uint16) []byte {
	if len(x) == 0 {
		return []byte{}
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(x))), 2*len(x))
}
