package main

import (
	"errors"
	"fmt"

	"gcompile/lower"
	"gcompile/runtime"
	"gcompile/runtime/cuda"
)

// openGPUs opens the GPUs this process drives: one per device it holds,
// the node's GPUs shared out by local rank (local rank l of a job whose
// processes hold k devices each drives GPUs l·k … l·k+k−1), or, with
// --pack-gpu, one GPU for all of them as virtual devices. Where the
// launcher shows each process only its own GPUs (SLURM's --gpus-per-task,
// CUDA_VISIBLE_DEVICES set per rank), a process drives the ones it sees.
func openGPUs(c *config, j *job) (rts []*cuda.Runtime, err error) {
	n := j.layout.PerProc()
	if !j.multi() {
		n = c.Devices
	}
	if c.packGPU {
		n = 1
	}
	visible, err := cuda.VisibleGPUs(cuda.Config{})
	if err != nil {
		return nil, err
	}
	first := j.world.LocalRank * n
	if first+n > visible && n <= visible {
		first = 0
	}
	defer func() {
		if err != nil {
			for _, rt := range rts {
				err = errors.Join(err, rt.Close())
			}
			rts = nil
		}
	}()
	for i := range n {
		rt, err := cuda.Open(cuda.Config{Ordinal: first + i})
		if err != nil {
			if i > 0 || first > 0 {
				err = fmt.Errorf("%w; this process drives %d device(s) on GPUs %d–%d (one GPU each; --pack-gpu runs a process's devices as virtual devices on one GPU)", err, n, first, first+n-1)
			}
			return rts, err
		}
		rts = append(rts, rt)
	}
	return rts, nil
}

// newCUDACluster loads this process's devices on its GPUs: virtual
// devices on one GPU (--pack-gpu, or one device), or one device per GPU
// connected by NCCL, in this process or across the job's.
func newCUDACluster(c *config, j *job, gpus []*cuda.Runtime, progs []*lower.Program) (*cuda.Cluster, error) {
	opts := cuda.Options{Timeout: j.timeout}
	switch {
	case j.multi():
		net, err := j.connect()
		if err != nil {
			return nil, err
		}
		return cuda.NewNCCLJobCluster(gpus, progs, opts, cuda.NCCLJob{
			Job: &runtime.Job{Layout: j.layout, Comm: net}, Dir: j.store, Timeout: j.timeout,
		})
	case len(gpus) == 1:
		return cuda.NewPipelineCluster(gpus[0], progs, opts)
	}
	return cuda.NewNCCLCluster(gpus, progs, opts)
}
