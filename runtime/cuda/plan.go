package cuda

import (
	"fmt"

	"gcompile/lower"
)

// InstrPlan is how the backend runs one instruction: its kernel launches
// (name<<<grid, block>>>), GEMMs, copies and collectives, in order.
type InstrPlan struct {
	Index int
	Op    string
	Where string
	Steps []string
}

// Plan prepares the program of device rank (progs holds one program per
// pipeline rank, as NewPipelineCluster takes them) exactly as Load does
// on a GPU — every kernel call checked against the kernel table's
// signatures, launch geometry, GEMM shapes, collectives, workspace — but
// without a GPU, and returns the launch plan and the workspace the device
// would allocate. An instruction the backend cannot run is an error that
// names it.
func Plan(progs []*lower.Program, rank int) ([]InstrPlan, Workspace, error) {
	n, err := meshDevices(progs)
	if err != nil {
		return nil, Workspace{}, err
	}
	if rank < 0 || rank >= n {
		return nil, Workspace{}, fmt.Errorf("rank %d of a %d-device mesh", rank, n)
	}
	prog := programOf(progs, rank)
	var cm comm
	if prog.Mesh != nil {
		cm = newFabric()
	}
	d, err := load(planningRuntime(), prog, Options{}, rank, cm)
	if err != nil {
		return nil, Workspace{}, err
	}
	plans := make([]InstrPlan, len(prog.Instrs))
	for i, in := range prog.Instrs {
		plans[i] = InstrPlan{Index: i, Op: in.Op, Where: where(in), Steps: d.notes[i]}
	}
	return plans, d.Workspace(), nil
}
