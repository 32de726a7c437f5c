package runtime_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"gcompile/lower"
	"gcompile/runtime"
	"gcompile/runtime/cpu"
)

// member is a device of a MeshCluster test: a HostView with a step.
type member struct {
	runtime.HostView
	step func() error
}

func (m *member) Step() error      { return m.step() }
func (m *member) Forward() error   { return m.step() }
func (m *member) PeakBytes() int64 { return 0 }

// A failing device aborts the others; the error returned is its own, not
// the aborts it caused, whichever rank it is.
func TestMeshClusterReportsTheFirstFailure(t *testing.T) {
	p := lowerText(t, paramsText)
	errEcho := errors.New("aborted")
	for bad := range 4 {
		t.Run(fmt.Sprint("rank", bad), func(t *testing.T) {
			stop := make(chan struct{})
			var once sync.Once
			c := runtime.NewMeshCluster[*member](
				func(error) { once.Do(func() { close(stop) }) },
				func(err error) bool { return errors.Is(err, errEcho) })
			for r := range 4 {
				c.Devices = append(c.Devices, &member{HostView: runtime.NewHostView(p, nil, &copyMemory{bufs: map[int][]byte{}}), step: func() error {
					if r == bad {
						return errors.New("kernel failed")
					}
					<-stop // a collective waiting for the failed device
					return fmt.Errorf("all_reduce: %w", errEcho)
				}})
			}
			err := c.Step()
			require.Error(t, err)
			assert.Equal(t, fmt.Sprintf("device %d: kernel failed", bad), err.Error())
		})
	}
}

const shardedText = `gir 1
module "sharded"
mesh dp=2,tp=2
%0 = state : f32[2,4] {name="w" place=[R,S(1)]} @model.go:1
%1 = state : f32[2,4] {name="g" place=[R,R]} @model.go:2
%2 = all_gather %0 : f32[2,4] {axis="tp" dim=1 place=[R,R]} @model.go:3
update %1 = %2
%3 = state : f32[2,4] {name="p" place=[P,R]} @model.go:4
%4 = input : i32[2,3] {name="ids" place=[S(0),R]} @model.go:5
`

// SetGlobal splits a whole tensor by placement and Global puts it back;
// the block each device holds is written out by hand here.
func TestMeshClusterSplitsAndAssemblesByPlacement(t *testing.T) {
	p := lowerText(t, shardedText)
	cl, err := cpu.NewCluster(p, cpu.Options{})
	require.NoError(t, err)
	require.Len(t, cl.Devices, 4)
	whole := []float64{0, 1, 2, 3, 10, 11, 12, 13}
	require.NoError(t, cl.SetGlobal("w", whole))
	for r, d := range cl.Devices {
		tp := r % 2 // tp is the last axis, so it varies fastest
		blk, err := d.Float64s("w")
		require.NoError(t, err)
		assert.Equal(t, []float64{float64(2 * tp), float64(2*tp + 1), float64(10 + 2*tp), float64(11 + 2*tp)}, blk, "device %d", r)
	}
	got, err := cl.Global("w")
	require.NoError(t, err)
	assert.Equal(t, whole, got)

	require.NoError(t, cl.Step())
	g, err := cl.Global("g")
	require.NoError(t, err)
	assert.Equal(t, whole, g, "every device gathered the whole tensor")

	require.NoError(t, cl.SetInt32("ids", []int32{1, 2, 3, 4, 5, 6}))
	for r, d := range cl.Devices {
		ids, err := d.Float64s("ids")
		require.NoError(t, err)
		row := float64(3 * (r / 2)) // dp splits the rows
		assert.Equal(t, []float64{row + 1, row + 2, row + 3}, ids, "device %d", r)
	}

	assert.ErrorContains(t, cl.SetGlobal("w", whole[:7]), `"w" is f32[2,4]; got 7 values`)
	assert.ErrorContains(t, cl.SetInt32("ids", []int32{1}), `"ids" is i32[2,3]; got 1 values`)
	assert.ErrorContains(t, cl.SetScalar("nope", 1), `no device holds a param, state or input named "nope"`)
	_, err = cl.Global("p")
	assert.ErrorContains(t, err, `"p" is a partial sum on some axis`)
	_, err = cl.Scalar("nope")
	assert.ErrorContains(t, err, `no device has an output named "nope"`)
}

func TestMeshDevicesWantsOneProgramPerPipelineRank(t *testing.T) {
	p := lowerText(t, shardedText)
	_, err := lower.MeshDevices(nil)
	assert.ErrorContains(t, err, "no programs to load")
	_, err = lower.MeshDevices([]*lower.Program{p, p})
	assert.ErrorContains(t, err, "2 programs for mesh")
	n, err := lower.MeshDevices([]*lower.Program{p})
	require.NoError(t, err)
	assert.Equal(t, 4, n)
	for r := range n {
		assert.Same(t, p, lower.ProgramOf([]*lower.Program{p}, r), "without pp every device runs the one program")
	}
}

// HeldRows is the rows of a batch input the process's devices hold: all of
// them with every device, one dp half with the devices of that half, and
// an unknown input is an error naming it.
func TestHeldRowsFollowsTheBatchSplit(t *testing.T) {
	p := lowerText(t, shardedText)
	rows := func(devs []*cpu.Device) []bool {
		cl, err := cpu.NewCluster(p, cpu.Options{})
		require.NoError(t, err)
		if devs != nil {
			cl.Devices = devs
		}
		want, err := cl.HeldRows("ids")
		require.NoError(t, err)
		return []bool{want(0), want(1), want(-1), want(2)}
	}
	cl, err := cpu.NewCluster(p, cpu.Options{})
	require.NoError(t, err)
	assert.Equal(t, []bool{true, true, false, false}, rows(nil))
	assert.Equal(t, []bool{true, false, false, false}, rows(cl.Devices[:2]), "dp rank 0's devices (tp varies fastest)")
	assert.Equal(t, []bool{false, true, false, false}, rows(cl.Devices[2:]), "dp rank 1's devices")
	_, err = cl.HeldRows("nope")
	assert.ErrorContains(t, err, `no device holds a param, state or input named "nope"`)
}
