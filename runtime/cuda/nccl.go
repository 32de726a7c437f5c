package cuda

import (
	"errors"
	"fmt"
	goruntime "runtime"

	"gcompile/lower"
	"gcompile/runtime/cuda/driver"
	"gcompile/runtime/cuda/nccl"
)

// ncclComm connects one device per GPU through NCCL: one communicator per
// group of devices along each mesh axis, all created in this process
// (ncclCommInitRank for every member inside one ncclGroupStart/End).
// Collectives are queued on each device's compute stream. NCCL chooses
// its own reduction order (rings, trees), so sums are deterministic for a
// fixed topology but not the CPU backend's position-order sums.
//
// Pipeline transfers are not built on NCCL: NCCL pairs sends with
// receives by their order on a communicator, not by tag, and an
// unbuffered send on the compute stream would wait for its receiver,
// which schedules the simulator proved deadlock-free under buffered sends
// do not allow. Pipelines run as virtual devices on one GPU.
type ncclComm struct {
	lib   *nccl.NCCL
	comms map[string][]nccl.Comm // by group key, one per position
}

func newNCCLComm(rts []*Runtime, progs []*lower.Program) (*ncclComm, error) {
	mesh := progs[0].Mesh
	if mesh == nil {
		return &ncclComm{}, nil
	}
	for _, p := range progs {
		for _, in := range p.Instrs {
			if in.Op == "send" || in.Op == "recv" {
				return nil, fmt.Errorf("%s: pipeline transfers between GPUs through NCCL are not supported yet; run the pipeline as virtual devices on one GPU", where(in))
			}
		}
	}
	lib, err := rts[0].NCCL()
	if err != nil {
		return nil, err
	}
	nc := &ncclComm{lib: lib, comms: map[string][]nccl.Comm{}}
	for ax := range mesh.Axes {
		for r := range mesh.Devices() {
			coords := mesh.Coords(r)
			if coords[ax] != 0 {
				continue // one group per line along the axis, found from its first member
			}
			if err := nc.init(rts, meshGroup(mesh, coords, r, ax)); err != nil {
				return nil, errors.Join(err, nc.close())
			}
		}
	}
	return nc, nil
}

// init creates the communicator of one group: every member joins inside
// one NCCL group, each with its GPU's context current.
func (nc *ncclComm) init(rts []*Runtime, g group) error {
	id, err := nc.lib.GetUniqueID()
	if err != nil {
		return err
	}
	goruntime.LockOSThread()
	defer goruntime.UnlockOSThread()
	if err := nc.lib.GroupStart(); err != nil {
		return err
	}
	comms := make([]nccl.Comm, g.size())
	var errs []error
	for pos, r := range g.ranks {
		if err := rts[r].drv.SetCurrent(rts[r].ctx); err != nil {
			errs = append(errs, err)
			break
		}
		if comms[pos], err = nc.lib.CommInitRank(g.size(), id, pos); err != nil {
			errs = append(errs, fmt.Errorf("devices [%s]: %w", g.key, err))
			break
		}
	}
	if err := nc.lib.GroupEnd(); err != nil {
		errs = append(errs, fmt.Errorf("devices [%s]: %w", g.key, err))
	}
	nc.comms[g.key] = comms
	return errors.Join(errs...)
}

func (nc *ncclComm) close() error {
	var errs []error
	for _, cs := range nc.comms {
		for _, c := range cs {
			if c != 0 {
				errs = append(errs, nc.lib.CommDestroy(c))
			}
		}
	}
	nc.comms = nil
	return errors.Join(errs...)
}

func (nc *ncclComm) comm(g group) (nccl.Comm, error) {
	cs, ok := nc.comms[g.key]
	if !ok || g.pos < 0 || g.pos >= len(cs) || cs[g.pos] == 0 {
		return 0, fmt.Errorf("no NCCL communicator for devices [%s]", g.key)
	}
	return cs[g.pos], nil
}

func (nc *ncclComm) site(*Device) (*site, error) { return nil, nil }

func (nc *ncclComm) allReduce(d *Device, g group, _ *site, bufs []driver.DevicePtr, counts []int64, _ driver.DevicePtr) error {
	c, err := nc.comm(g)
	if err != nil {
		return err
	}
	if len(bufs) > 1 {
		if err := nc.lib.GroupStart(); err != nil {
			return err
		}
	}
	var errs []error
	for k := range bufs {
		if err := nc.lib.AllReduce(bufs[k], bufs[k], uint64(counts[k]), nccl.Float32, nccl.Sum, c, d.compute); err != nil {
			errs = append(errs, err)
			break
		}
	}
	if len(bufs) > 1 {
		errs = append(errs, nc.lib.GroupEnd())
	}
	return errors.Join(errs...)
}

func (nc *ncclComm) reduceScatter(d *Device, g group, _ *site, src, out driver.DevicePtr, count int64) error {
	c, err := nc.comm(g)
	if err != nil {
		return err
	}
	return nc.lib.ReduceScatter(src, out, uint64(count), nccl.Float32, nccl.Sum, c, d.compute)
}

func (nc *ncclComm) allGather(d *Device, g group, _ *site, src, out driver.DevicePtr, bytes int64) error {
	c, err := nc.comm(g)
	if err != nil {
		return err
	}
	return nc.lib.AllGather(src, out, uint64(bytes), nccl.Uint8, c, d.compute)
}

func (nc *ncclComm) allToAll(d *Device, g group, _ *site, src, out driver.DevicePtr, bytes int64) error {
	c, err := nc.comm(g)
	if err != nil {
		return err
	}
	return nc.lib.AllToAll(src, out, uint64(bytes), nccl.Uint8, c, d.compute)
}

var errNCCLTransfer = errors.New("pipeline transfers between GPUs through NCCL are not supported yet")

func (nc *ncclComm) prepareSend(*Device, int64) (*sendSlot, error) { return nil, errNCCLTransfer }

func (nc *ncclComm) send(*Device, *sendSlot, int, int, driver.DevicePtr, int64) error {
	return errNCCLTransfer
}

func (nc *ncclComm) recv(*Device, int, int, driver.DevicePtr, int64) error { return errNCCLTransfer }

// abort has nothing to wake on the host: NCCL calls return once queued.
// A device whose stream waits in a collective for a rank that failed
// stays stuck in its step's final synchronization; freeing it needs
// ncclCommAbort, which the bindings do not have yet.
func (nc *ncclComm) abort(error) {}
