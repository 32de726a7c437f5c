package runtime

import (
	"context"
	"fmt"
)

// Layout says which devices of a job each process holds: Devices global
// ranks in contiguous blocks of Devices/Procs, process p holding ranks
// [p·k, (p+1)·k). Contiguous blocks keep tensor-parallel groups (the last
// mesh axis, adjacent ranks) inside one process or node where they fit,
// as Megatron-LM lays ranks out.
type Layout struct {
	Devices int // devices in the whole job (--devices)
	Procs   int // processes in the job
	Proc    int // this process
}

// SingleProcess is the layout of a job whose devices all live here.
func SingleProcess(devices int) Layout { return Layout{Devices: devices, Procs: 1} }

// Check reports a layout that does not split the devices evenly.
func (l Layout) Check() error {
	switch {
	case l.Devices < 1:
		return fmt.Errorf("a job needs at least one device, got %d", l.Devices)
	case l.Procs < 1:
		return fmt.Errorf("a job needs at least one process, got %d", l.Procs)
	case l.Proc < 0 || l.Proc >= l.Procs:
		return fmt.Errorf("process %d is outside the job's %d processes", l.Proc, l.Procs)
	case l.Devices%l.Procs != 0:
		return fmt.Errorf("%d devices do not split evenly over %d processes: --devices must be a multiple of the number of processes", l.Devices, l.Procs)
	}
	return nil
}

// PerProc is the number of devices each process holds.
func (l Layout) PerProc() int { return l.Devices / max(l.Procs, 1) }

// Local is this process's ranks, ascending.
func (l Layout) Local() []int {
	k := l.PerProc()
	ranks := make([]int, k)
	for i := range ranks {
		ranks[i] = l.Proc*k + i
	}
	return ranks
}

// ProcOf is the process holding rank.
func (l Layout) ProcOf(rank int) int { return rank / max(l.PerProc(), 1) }

// Lead is the first rank of process p: the one that speaks for it in the
// host's exchanges between steps.
func (l Layout) Lead(p int) int { return p * l.PerProc() }

// Holds reports whether this process holds rank.
func (l Layout) Holds(rank int) bool { return l.ProcOf(rank) == l.Proc }

// Job is what a cluster needs to know about the devices it does not hold:
// where every rank lives and how to reach the processes holding them.
type Job struct {
	Layout Layout
	// Comm connects every rank of the job; the devices' collectives and
	// the host's exchanges (scalars, gathered tensors, metrics) use it.
	Comm Comm
}

// HostChannel is the Group.Channel of the host's exchanges between steps,
// kept apart from the devices' collectives.
const HostChannel = "host"

// Directory is a key-value store every process of a job reaches (the
// rendezvous store): processes publish their addresses and communicator
// ids there. Get waits for a key that is not there yet.
type Directory interface {
	Set(ctx context.Context, key string, value []byte) error
	Get(ctx context.Context, key string) ([]byte, error)
}
