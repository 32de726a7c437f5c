package cuda

import (
	"errors"
	"fmt"
	goruntime "runtime"
	"sort"
	"sync"

	"gcompile/ir"
	"gcompile/lower"
	"gcompile/runtime/cuda/driver"
	"gcompile/runtime/cuda/nccl"
)

// ncclComm connects devices that each have a GPU of their own through
// NCCL, in one process or across processes: one communicator per group of
// devices along each mesh axis, used for collectives on each device's
// compute stream (gradient buckets' all-reduces on its comm stream,
// ordered against the compute stream's collectives of the same group by
// events, see planBucketWaits), and one two-rank communicator per ordered
// pair of devices that exchange pipeline transfers, used for nothing
// else.
//
// NCCL pairs a send with a receive by their order on a communicator, not
// by tag, and its sends wait for the receiver. The pipeline lowering
// sends a value as soon as it is computed and receives it where it is
// first used, so the two ends of a pair need not list their transfers in
// the same order (a tied embedding goes out first and is used last).
// Transfers therefore run on streams of their own: a pair's sends are
// queued on the sender's stream for that pair in program order, from a
// staging copy, and never hold up its compute stream; the receiver posts
// receives for that pair on its own stream in the sender's order (known
// at load from the sender's program), into staging, and its compute
// stream waits only for the one it needs. A receive is thus posted no
// later than the program needs it, and every wait is for something the
// sender has already sent or will send without waiting for the receiver,
// as under the buffered sends the schedules are proven deadlock-free
// with. Sums are NCCL's (rings and trees), deterministic for a fixed
// topology but not the CPU backend's position-order sums.
type ncclComm struct {
	lib *nccl.NCCL
	// comms are the collectives' communicators by group key, one per
	// position, 0 where another process holds that position.
	comms map[string][]nccl.Comm
	// links are the pipeline pairs' communicators by (sender, receiver)
	// global rank, the sender's end at 0, the receiver's at 1: 0 where
	// another process holds that end.
	links map[[2]int][2]nccl.Comm
	// order is, for each pair, the sender's transfers in its program's
	// order: what the receiver posts, in that order.
	order map[[2]int][]transfer
	// made lists this process's communicators in the order they were
	// made, which is the same in every process: they are destroyed in it
	// too, since a destroy may wait for the other processes' ends.
	made []nccl.Comm

	mu      sync.Mutex
	aborted error // why abort was called; nil until then
}

// transfer is one pipeline send as the receiver needs to know it.
type transfer struct {
	tag   int
	bytes int64
}

// idSource hands out the unique id of the communicator named key: the
// process holding the group's first member makes it (creator), the others
// fetch it. In one process it only makes ids.
type idSource func(key string, creator bool, make func() (nccl.UniqueID, error)) (nccl.UniqueID, error)

// localIDs is the idSource of a cluster that holds every device.
func localIDs(_ string, _ bool, make func() (nccl.UniqueID, error)) (nccl.UniqueID, error) {
	return make()
}

// newNCCLComm makes the communicators the devices of local (runtimes by
// global rank) need to run progs, one per pipeline rank over their mesh.
// Every process of a job calls it with its own devices and the same
// programs, and communicators are made in one global order, so that no
// process waits in one communicator's creation for a process waiting in
// another's.
func newNCCLComm(local map[int]*Runtime, progs []*lower.Program, ids idSource) (nc *ncclComm, err error) {
	mesh := progs[0].Mesh
	nc = &ncclComm{comms: map[string][]nccl.Comm{}, links: map[[2]int][2]nccl.Comm{}, order: map[[2]int][]transfer{}}
	if mesh == nil {
		return nc, nil
	}
	for _, rt := range local {
		if nc.lib, err = rt.NCCL(); err != nil {
			return nil, err
		}
		break
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, nc.close())
			nc = nil
		}
	}()
	for ax := range mesh.Axes {
		for r := range mesh.Devices() {
			coords := mesh.Coords(r)
			if coords[ax] != 0 {
				continue // one group per line along the axis, found from its first member
			}
			g := meshGroup(mesh, coords, r, ax)
			cs, err := nc.init(local, g.ranks, g.key, ids)
			if err != nil {
				return nil, err
			}
			if cs != nil {
				nc.comms[g.key] = cs
			}
		}
	}
	for _, pair := range pipelinePairs(progs) {
		nc.order[pair] = sentTo(progs, pair[0], pair[1])
		cs, err := nc.init(local, pair[:], fmt.Sprintf("p2p:%d>%d", pair[0], pair[1]), ids)
		if err != nil {
			return nil, err
		}
		nc.links[pair] = [2]nccl.Comm(cs)
	}
	return nc, nil
}

// pipelinePairs are the (sender, receiver) global ranks of every pipeline
// transfer of every device, each once, in rank order.
func pipelinePairs(progs []*lower.Program) [][2]int {
	mesh := progs[0].Mesh
	seen := map[[2]int]bool{}
	var pairs [][2]int
	for r := range mesh.Devices() {
		for _, in := range lower.ProgramOf(progs, r).Instrs {
			if in.Op != "send" {
				continue
			}
			p := [2]int{r, peerRank(mesh, r, in.Peer)}
			if !seen[p] {
				seen[p] = true
				pairs = append(pairs, p)
			}
		}
	}
	sort.Slice(pairs, func(i, j int) bool {
		return pairs[i][0] < pairs[j][0] || pairs[i][0] == pairs[j][0] && pairs[i][1] < pairs[j][1]
	})
	return pairs
}

// peerRank is the global rank of the device with rank's coordinates but
// pipeline rank pp.
func peerRank(mesh *ir.Mesh, rank, pp int) int {
	c := mesh.Coords(rank)
	c[mesh.PipelineAxis()] = pp
	return mesh.Rank(c)
}

// sentTo lists what device from sends device to, in from's program order.
func sentTo(progs []*lower.Program, from, to int) []transfer {
	mesh := progs[0].Mesh
	var out []transfer
	prog := lower.ProgramOf(progs, from)
	for _, in := range prog.Instrs {
		if in.Op == "send" && peerRank(mesh, from, in.Peer) == to {
			out = append(out, transfer{tag: in.Tag, bytes: prog.Buffers[in.Args[0]].Bytes})
		}
	}
	return out
}

// init makes the communicator of one group for the members this process
// holds (inside one NCCL group call, each with its GPU's context current)
// and returns them by position, or nil when it holds none.
func (nc *ncclComm) init(local map[int]*Runtime, ranks []int, key string, ids idSource) ([]nccl.Comm, error) {
	mine := false
	for _, r := range ranks {
		if local[r] != nil {
			mine = true
		}
	}
	if !mine {
		return nil, nil
	}
	id, err := ids(key, local[ranks[0]] != nil, nc.lib.GetUniqueID)
	if err != nil {
		return nil, fmt.Errorf("the NCCL id of devices [%s]: %w", key, err)
	}
	goruntime.LockOSThread()
	defer goruntime.UnlockOSThread()
	if err := nc.lib.GroupStart(); err != nil {
		return nil, err
	}
	comms := make([]nccl.Comm, len(ranks))
	var errs []error
	for pos, r := range ranks {
		rt := local[r]
		if rt == nil {
			continue
		}
		if err := rt.drv.SetCurrent(rt.ctx); err != nil {
			errs = append(errs, err)
			break
		}
		if comms[pos], err = nc.lib.CommInitRank(len(ranks), id, pos); err != nil {
			errs = append(errs, fmt.Errorf("devices [%s]: %w", key, err))
			break
		}
	}
	if err := nc.lib.GroupEnd(); err != nil {
		errs = append(errs, fmt.Errorf("devices [%s]: %w", key, err))
	}
	if err := errors.Join(errs...); err != nil {
		for _, c := range comms {
			if c != 0 {
				_ = nc.lib.CommDestroy(c)
			}
		}
		return nil, err
	}
	for _, c := range comms {
		if c != 0 {
			nc.made = append(nc.made, c)
		}
	}
	return comms, nil
}

func (nc *ncclComm) close() error {
	nc.mu.Lock()
	aborted := nc.aborted != nil
	nc.mu.Unlock()
	var errs []error
	if !aborted {
		for _, c := range nc.made {
			errs = append(errs, nc.lib.CommDestroy(c))
		}
	}
	nc.comms, nc.links, nc.made = nil, nil, nil
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

// stagesSums is false: NCCL reduces in place.
func (nc *ncclComm) stagesSums() bool { return false }

func (nc *ncclComm) allReduce(d *Device, g group, s *site, bufs []driver.DevicePtr, counts []int64, tmp driver.DevicePtr) error {
	return nc.allReduceOn(d, g, s, d.compute, ir.F32, bufs, counts, tmp)
}

// ncclType is the NCCL element type of a summed dtype. NCCL's own 16-bit
// sums round at every step of its ring or tree, in its own order.
func ncclType(dt ir.DType) nccl.DataType {
	switch dt {
	case ir.BF16:
		return nccl.Bfloat16
	case ir.F16:
		return nccl.Float16
	}
	return nccl.Float32
}

func (nc *ncclComm) allReduceOn(d *Device, g group, _ *site, st driver.Stream, dt ir.DType, bufs []driver.DevicePtr, counts []int64, _ driver.DevicePtr) error {
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
		if err := nc.lib.AllReduce(bufs[k], bufs[k], uint64(counts[k]), ncclType(dt), nccl.Sum, c, st); err != nil {
			errs = append(errs, err)
			break
		}
	}
	if len(bufs) > 1 {
		errs = append(errs, nc.lib.GroupEnd())
	}
	return nc.failed(errors.Join(errs...))
}

func (nc *ncclComm) reduceScatter(d *Device, g group, _ *site, st driver.Stream, dt ir.DType, src, out driver.DevicePtr, count int64) error {
	c, err := nc.comm(g)
	if err != nil {
		return err
	}
	return nc.failed(nc.lib.ReduceScatter(src, out, uint64(count), ncclType(dt), nccl.Sum, c, st))
}

func (nc *ncclComm) allGather(d *Device, g group, _ *site, src, out driver.DevicePtr, bytes int64) error {
	c, err := nc.comm(g)
	if err != nil {
		return err
	}
	return nc.failed(nc.lib.AllGather(src, out, uint64(bytes), nccl.Uint8, c, d.compute))
}

func (nc *ncclComm) allToAll(d *Device, g group, _ *site, src, out driver.DevicePtr, bytes int64) error {
	c, err := nc.comm(g)
	if err != nil {
		return err
	}
	return nc.failed(nc.lib.AllToAll(src, out, uint64(bytes), nccl.Uint8, c, d.compute))
}

// shift sends each buffer to the next member of g and receives the
// previous member's, all in one group so that no member waits for another
// to post first.
func (nc *ncclComm) shift(d *Device, g group, _ *site, st driver.Stream, srcs, dsts []driver.DevicePtr, bytes []int64) error {
	c, err := nc.comm(g)
	if err != nil {
		return err
	}
	n := g.size()
	next, prev := (g.pos+1)%n, (g.pos+n-1)%n
	if err := nc.lib.GroupStart(); err != nil {
		return err
	}
	var errs []error
	for k := range srcs {
		if err := nc.lib.Send(srcs[k], uint64(bytes[k]), nccl.Uint8, next, c, st); err != nil {
			errs = append(errs, err)
			break
		}
		if err := nc.lib.Recv(dsts[k], uint64(bytes[k]), nccl.Uint8, prev, c, st); err != nil {
			errs = append(errs, err)
			break
		}
	}
	// The group is closed even after a failure, so NCCL is not left in it.
	errs = append(errs, nc.lib.GroupEnd())
	return nc.failed(errors.Join(errs...))
}

// prepareSend reserves the send's staging region and the events that order
// the pair's stream after the copy into it.
func (nc *ncclComm) prepareSend(d *Device, peer int, bytes int64) (*sendSlot, error) {
	if nc.links[[2]int{d.rank, peer}][0] == 0 {
		return nil, fmt.Errorf("no NCCL link from device %d to device %d", d.rank, peer)
	}
	if _, err := d.linkStream(peer, true); err != nil {
		return nil, err
	}
	return newSendSlot(d, bytes)
}

// send copies the data into staging on the compute stream, then sends it
// from there on the pair's stream: the compute stream goes on at once.
func (nc *ncclComm) send(d *Device, s *sendSlot, peer, tag int, src driver.DevicePtr, bytes int64) error {
	link := nc.links[[2]int{d.rank, peer}][0]
	if link == 0 {
		return fmt.Errorf("no NCCL link from device %d to device %d", d.rank, peer)
	}
	stream, err := d.linkStream(peer, true)
	if err != nil {
		return err
	}
	drv := d.rt.drv
	staging := d.ptr(s.staging)
	if err := drv.MemcpyDtoDAsync(staging, src, uint64(bytes), d.compute); err != nil {
		return err
	}
	if err := drv.EventRecord(s.ready, d.compute); err != nil {
		return err
	}
	if err := drv.StreamWaitEvent(stream, s.ready); err != nil {
		return err
	}
	if err := nc.lib.Send(staging, uint64(bytes), nccl.Uint8, 1, link, stream); err != nil {
		return fmt.Errorf("pipeline transfer %d to device %d: %w", tag, peer, nc.failed(err))
	}
	return nil
}

// inbox is one device's receiving end of one pair: a staging region and a
// ready event per transfer the sender makes, in the sender's order, and
// how many of them this step has posted.
type inbox struct {
	msgs   []inMsg
	posted int
	// byTag lists each tag's positions in msgs; used counts how many of
	// them this step has taken (a tag sent twice is taken in order).
	byTag map[int][]int
	used  map[int]int
}

type inMsg struct {
	transfer
	staging loc
	ready   driver.Event
}

// prepareRecv sets up, at the receive's load, the device's inbox for the
// pair (its first receive from the peer makes it) and checks that the
// sender sends this tag with this size.
func (nc *ncclComm) prepareRecv(d *Device, peer, tag int, bytes int64) error {
	key := [2]int{peer, d.rank}
	if nc.links[key][1] == 0 {
		return fmt.Errorf("no NCCL link from device %d to device %d", peer, d.rank)
	}
	if _, err := d.linkStream(peer, false); err != nil {
		return err
	}
	box := d.inboxes[peer]
	if box == nil {
		box = &inbox{byTag: map[int][]int{}, used: map[int]int{}}
		for i, t := range nc.order[key] {
			ready, err := d.event()
			if err != nil {
				return err
			}
			box.msgs = append(box.msgs, inMsg{transfer: t, staging: loc{inKeep, d.keep.take(t.bytes)}, ready: ready})
			box.byTag[t.tag] = append(box.byTag[t.tag], i)
		}
		d.inboxes[peer] = box
	}
	found := false
	for _, i := range box.byTag[tag] {
		if box.msgs[i].bytes == bytes {
			found = true
		}
	}
	if !found {
		return fmt.Errorf("device %d receives transfer %d (%d bytes) from device %d, whose program sends no such transfer to it", d.rank, tag, bytes, peer)
	}
	return nil
}

// recv posts, on the pair's stream and in the sender's order, every
// receive up to the one wanted, then makes the compute stream wait for
// that one and copy it out of staging.
func (nc *ncclComm) recv(d *Device, peer, tag int, dst driver.DevicePtr, bytes int64) error {
	link := nc.links[[2]int{peer, d.rank}][1]
	box := d.inboxes[peer]
	if box == nil {
		return fmt.Errorf("device %d has no inbox for device %d", d.rank, peer)
	}
	at := box.byTag[tag]
	n := box.used[tag]
	if n >= len(at) {
		return fmt.Errorf("pipeline transfer %d from device %d: received more often than the sender sends it (%d times)", tag, peer, len(at))
	}
	want := at[n]
	box.used[tag] = n + 1
	if box.msgs[want].bytes != bytes {
		return fmt.Errorf("pipeline transfer %d from device %d: %d bytes sent, %d expected", tag, peer, box.msgs[want].bytes, bytes)
	}
	stream, err := d.linkStream(peer, false)
	if err != nil {
		return err
	}
	drv := d.rt.drv
	for ; box.posted <= want; box.posted++ {
		m := box.msgs[box.posted]
		if err := nc.lib.Recv(d.ptr(m.staging), uint64(m.bytes), nccl.Uint8, 0, link, stream); err != nil {
			return fmt.Errorf("pipeline transfer %d from device %d: %w", m.tag, peer, nc.failed(err))
		}
		if err := drv.EventRecord(m.ready, stream); err != nil {
			return err
		}
	}
	m := box.msgs[want]
	if err := drv.StreamWaitEvent(d.compute, m.ready); err != nil {
		return err
	}
	return drv.MemcpyDtoDAsync(dst, d.ptr(m.staging), uint64(bytes), d.compute)
}

// abort frees every device waiting in NCCL: ncclCommAbort on every
// communicator this process holds, which ends their pending operations
// (the other processes' calls on them fail too).
func (nc *ncclComm) abort(err error) {
	nc.mu.Lock()
	if nc.aborted != nil {
		nc.mu.Unlock()
		return
	}
	if err == nil {
		err = errors.New("abort was called with a nil error")
	}
	nc.aborted = err
	nc.mu.Unlock()
	for _, c := range nc.made {
		_ = nc.lib.CommAbort(c)
	}
}

// failed is an NCCL call's error, marked as the echo of an abort when the
// communicators were aborted: the cluster then reports the cause instead.
func (nc *ncclComm) failed(err error) error {
	if err == nil {
		return nil
	}
	nc.mu.Lock()
	cause := nc.aborted
	nc.mu.Unlock()
	if cause != nil {
		return fmt.Errorf("%w (%v): %w", ErrAborted, err, cause)
	}
	return err
}
