package lower

import (
	"errors"
	"fmt"
)

// MeshDevices checks that progs has one program per pipeline rank of
// their shared mesh and returns the mesh's device count (1 without a
// mesh).
func MeshDevices(progs []*Program) (int, error) {
	if len(progs) == 0 {
		return 0, errors.New("no programs to load")
	}
	mesh := progs[0].Mesh
	n, ppAxis := 1, -1
	if mesh != nil {
		n, ppAxis = mesh.Devices(), mesh.PipelineAxis()
	}
	if ppAxis < 0 && len(progs) != 1 || ppAxis >= 0 && len(progs) != mesh.Axes[ppAxis].Size {
		return 0, fmt.Errorf("%d programs for mesh %v: want one per pipeline rank", len(progs), mesh)
	}
	return n, nil
}

// ProgramOf is the program device rank runs: its pipeline rank's, from
// progs as MeshDevices accepts them.
func ProgramOf(progs []*Program, rank int) *Program {
	mesh := progs[0].Mesh
	if mesh.PipelineAxis() < 0 {
		return progs[0]
	}
	return progs[mesh.Coords(rank)[mesh.PipelineAxis()]]
}
