package main

import (
	"fmt"

	"gcompile/lower"
	"gcompile/runtime/cuda"
)

// openGPUs opens the GPUs this process drives: one per device it holds,
// starting at its local rank's share of the node's GPUs, or, with
// --pack-gpu, one GPU for all of them (virtual devices).
func openGPUs(c *config, j *job) ([]*cuda.Runtime, error) {
	n := j.layout.PerProc()
	if !j.multi() {
		n = c.Devices
	}
	if c.packGPU || n == 1 || !j.multi() {
		ordinal := j.world.LocalRank
		if !j.multi() {
			ordinal = 0
		}
		rt, err := cuda.Open(cuda.Config{Ordinal: ordinal})
		if err != nil {
			return nil, err
		}
		return []*cuda.Runtime{rt}, nil
	}
	return nil, fmt.Errorf("--backend cuda with several devices per process in a job of several processes: %w (add --pack-gpu)", errNotYet)
}

// newCUDACluster loads this process's devices on its GPUs.
func newCUDACluster(c *config, j *job, gpus []*cuda.Runtime, progs []*lower.Program) (*cuda.Cluster, error) {
	if j.multi() {
		return nil, fmt.Errorf("--backend cuda across processes: %w", errNotYet)
	}
	return cuda.NewPipelineCluster(gpus[0], progs, cuda.Options{})
}
