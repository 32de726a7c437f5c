package nccl

import (
	"errors"
	"fmt"
	"unsafe"

	"gcompile/runtime/cuda/dl"
	"gcompile/runtime/cuda/driver"
)

// NCCL is the loaded NCCL library.
type NCCL struct {
	lib *dl.Lib

	ncclGetVersion           func(v *int32) Result
	ncclGetUniqueId          func(id *UniqueID) Result
	ncclCommInitRank         func(c *Comm, nranks int32, id UniqueID, rank int32) Result
	ncclCommDestroy          func(c Comm) Result
	ncclCommAbort            func(c Comm) Result
	ncclCommGetAsyncError    func(c Comm, r *Result) Result
	ncclCommSplit            func(c Comm, color, key int32, newcomm *Comm, config unsafe.Pointer) Result          // optional
	ncclCommInitRankScalable func(c *Comm, nranks, rank, nIDs int32, ids *UniqueID, config unsafe.Pointer) Result // optional
	ncclCommCount            func(c Comm, n *int32) Result
	ncclCommUserRank         func(c Comm, r *int32) Result
	ncclAllReduce            func(send, recv driver.DevicePtr, count uint64, t DataType, op RedOp, c Comm, s driver.Stream) Result
	ncclReduceScatter        func(send, recv driver.DevicePtr, recvCount uint64, t DataType, op RedOp, c Comm, s driver.Stream) Result
	ncclAllGather            func(send, recv driver.DevicePtr, sendCount uint64, t DataType, c Comm, s driver.Stream) Result
	ncclBroadcast            func(send, recv driver.DevicePtr, count uint64, t DataType, root int32, c Comm, s driver.Stream) Result
	ncclSend                 func(send driver.DevicePtr, count uint64, t DataType, peer int32, c Comm, s driver.Stream) Result
	ncclRecv                 func(recv driver.DevicePtr, count uint64, t DataType, peer int32, c Comm, s driver.Stream) Result
	ncclGroupStart           func() Result
	ncclGroupEnd             func() Result
	ncclAlltoAll             func(send, recv driver.DevicePtr, count uint64, t DataType, c Comm, s driver.Stream) Result // optional
	ncclGetErrorString       func(r Result) string
	ncclGetLastError         func(c Comm) string // optional
}

// Load finds libnccl with dl.DefaultSearch and binds it.
func Load() (*NCCL, error) { return LoadFrom(dl.DefaultSearch()) }

// LoadFrom finds libnccl with s and binds it.
func LoadFrom(s dl.Search) (*NCCL, error) {
	lib, err := s.Open(dl.NCCL)
	if err != nil {
		return nil, err
	}
	n := &NCCL{lib: lib}
	err = lib.BindAll([]dl.Symbol{
		dl.Sym(&n.ncclGetVersion, "ncclGetVersion"),
		dl.Sym(&n.ncclGetUniqueId, "ncclGetUniqueId"),
		dl.Sym(&n.ncclCommInitRank, "ncclCommInitRank"),
		dl.Sym(&n.ncclCommDestroy, "ncclCommDestroy"),
		dl.Sym(&n.ncclCommAbort, "ncclCommAbort"),
		dl.Sym(&n.ncclCommGetAsyncError, "ncclCommGetAsyncError"),
		dl.Optional(&n.ncclCommSplit, "ncclCommSplit"),
		dl.Optional(&n.ncclCommInitRankScalable, "ncclCommInitRankScalable"),
		dl.Sym(&n.ncclCommCount, "ncclCommCount"),
		dl.Sym(&n.ncclCommUserRank, "ncclCommUserRank"),
		dl.Sym(&n.ncclAllReduce, "ncclAllReduce"),
		dl.Sym(&n.ncclReduceScatter, "ncclReduceScatter"),
		dl.Sym(&n.ncclAllGather, "ncclAllGather"),
		dl.Sym(&n.ncclBroadcast, "ncclBroadcast"),
		dl.Sym(&n.ncclSend, "ncclSend"),
		dl.Sym(&n.ncclRecv, "ncclRecv"),
		dl.Sym(&n.ncclGroupStart, "ncclGroupStart"),
		dl.Sym(&n.ncclGroupEnd, "ncclGroupEnd"),
		dl.Optional(&n.ncclAlltoAll, "ncclAlltoAll"),
		dl.Sym(&n.ncclGetErrorString, "ncclGetErrorString"),
		dl.Optional(&n.ncclGetLastError, "ncclGetLastError"),
	})
	if err != nil {
		lib.Close()
		return nil, fmt.Errorf("nccl: %s is not a usable NCCL: %w", lib.Path, err)
	}
	return n, nil
}

// Path is the file NCCL was loaded from.
func (n *NCCL) Path() string { return n.lib.Path }

// Close unloads the library.
func (n *NCCL) Close() error { return n.lib.Close() }

// HasAllToAll reports whether the library has a native ncclAlltoAll.
func (n *NCCL) HasAllToAll() bool { return n.ncclAlltoAll != nil }

// HasCommSplit reports whether the library has ncclCommSplit (NCCL 2.18
// and later).
func (n *NCCL) HasCommSplit() bool { return n.ncclCommSplit != nil }

// HasCommInitRankScalable reports whether the library has
// ncclCommInitRankScalable (NCCL 2.23 and later).
func (n *NCCL) HasCommInitRankScalable() bool { return n.ncclCommInitRankScalable != nil }

func (n *NCCL) check(fn string, c Comm, r Result) error {
	if r == Success {
		return nil
	}
	e := &Error{Func: fn, Code: r, Msg: n.ncclGetErrorString(r)}
	if n.ncclGetLastError != nil {
		e.Detail = n.ncclGetLastError(c)
	}
	return e
}

// Version is NCCL's version code (22803 is 2.28.3).
func (n *NCCL) Version() (int, error) {
	var v int32
	if err := n.check("ncclGetVersion", 0, n.ncclGetVersion(&v)); err != nil {
		return 0, err
	}
	return int(v), nil
}

// GetUniqueID creates the id of a new communicator, on one rank only.
func (n *NCCL) GetUniqueID() (UniqueID, error) {
	var id UniqueID
	if err := n.check("ncclGetUniqueId", 0, n.ncclGetUniqueId(&id)); err != nil {
		return UniqueID{}, err
	}
	return id, nil
}

// CommInitRank joins rank to the nranks-wide communicator named by id. Every
// rank must call it, each with the device it uses current; it returns once
// all have joined.
func (n *NCCL) CommInitRank(nranks int, id UniqueID, rank int) (Comm, error) {
	if nranks < 1 || rank < 0 || rank >= nranks {
		return 0, fmt.Errorf("nccl: rank %d of %d is out of range", rank, nranks)
	}
	var c Comm
	if err := n.check("ncclCommInitRank", 0, n.ncclCommInitRank(&c, int32(nranks), id, int32(rank))); err != nil {
		return 0, fmt.Errorf("nccl: rank %d of %d: %w", rank, nranks, err)
	}
	return c, nil
}

// CommInitRankScalable is CommInitRank for communicators whose ranks
// spread NCCL's bootstrap over several ids: every rank passes the same
// ids, each created by a different rank with GetUniqueID. It needs NCCL
// 2.23 or later (see HasCommInitRankScalable).
func (n *NCCL) CommInitRankScalable(nranks, rank int, ids []UniqueID) (Comm, error) {
	if n.ncclCommInitRankScalable == nil {
		return 0, fmt.Errorf("nccl: %s has no ncclCommInitRankScalable (NCCL 2.23 or later has it): %w", n.lib.Path, errors.ErrUnsupported)
	}
	if nranks < 1 || rank < 0 || rank >= nranks {
		return 0, fmt.Errorf("nccl: rank %d of %d is out of range", rank, nranks)
	}
	if len(ids) < 1 || len(ids) > nranks {
		return 0, fmt.Errorf("nccl: rank %d of %d: %d unique ids, want 1 to %d", rank, nranks, len(ids), nranks)
	}
	var c Comm
	r := n.ncclCommInitRankScalable(&c, int32(nranks), int32(rank), int32(len(ids)), &ids[0], nil)
	if err := n.check("ncclCommInitRankScalable", 0, r); err != nil {
		return 0, fmt.Errorf("nccl: rank %d of %d: %w", rank, nranks, err)
	}
	return c, nil
}

// CommDestroy frees a communicator once its queued work is done.
func (n *NCCL) CommDestroy(c Comm) error {
	return n.check("ncclCommDestroy", c, n.ncclCommDestroy(c))
}

// CommAbort frees a communicator at once, abandoning its queued work. It
// may be called from another thread while a call on c is blocked, which
// then fails; the other ranks' calls that need this one fail too (with
// RemoteError), rather than hang.
func (n *NCCL) CommAbort(c Comm) error {
	return n.check("ncclCommAbort", c, n.ncclCommAbort(c))
}

// CommGetAsyncError reports an error that happened on c outside any call
// (a peer that died or aborted, say): Success while there is none. The
// error return is for the query itself failing.
func (n *NCCL) CommGetAsyncError(c Comm) (Result, error) {
	var r Result
	if err := n.check("ncclCommGetAsyncError", c, n.ncclCommGetAsyncError(c, &r)); err != nil {
		return 0, err
	}
	return r, nil
}

// SplitNoColor is NCCL_SPLIT_NOCOLOR: the rank joins no new communicator.
const SplitNoColor = -1

// CommSplit makes new communicators from c: the ranks that pass the same
// color form one, ranked by key (ties by their rank in c). Every rank of c
// must call it. A rank passing SplitNoColor gets 0 and no error. It needs
// NCCL 2.18 or later (see HasCommSplit); the new communicator takes NCCL's
// default configuration.
func (n *NCCL) CommSplit(c Comm, color, key int) (Comm, error) {
	if n.ncclCommSplit == nil {
		return 0, fmt.Errorf("nccl: %s has no ncclCommSplit (NCCL 2.18 or later has it): %w", n.lib.Path, errors.ErrUnsupported)
	}
	var nc Comm
	if err := n.check("ncclCommSplit", c, n.ncclCommSplit(c, int32(color), int32(key), &nc, nil)); err != nil {
		return 0, fmt.Errorf("nccl: split with color %d, key %d: %w", color, key, err)
	}
	return nc, nil
}

// CommCount is the number of ranks in c.
func (n *NCCL) CommCount(c Comm) (int, error) {
	var v int32
	if err := n.check("ncclCommCount", c, n.ncclCommCount(c, &v)); err != nil {
		return 0, err
	}
	return int(v), nil
}

// CommUserRank is this process's rank in c.
func (n *NCCL) CommUserRank(c Comm) (int, error) {
	var v int32
	if err := n.check("ncclCommUserRank", c, n.ncclCommUserRank(c, &v)); err != nil {
		return 0, err
	}
	return int(v), nil
}

// AllReduce reduces count elements of send across ranks into recv on every
// rank (recv may equal send).
func (n *NCCL) AllReduce(send, recv driver.DevicePtr, count uint64, t DataType, op RedOp, c Comm, s driver.Stream) error {
	return n.check("ncclAllReduce", c, n.ncclAllReduce(send, recv, count, t, op, c, s))
}

// ReduceScatter reduces nranks·recvCount elements of send across ranks and
// leaves block r of the result in rank r's recv.
func (n *NCCL) ReduceScatter(send, recv driver.DevicePtr, recvCount uint64, t DataType, op RedOp, c Comm, s driver.Stream) error {
	return n.check("ncclReduceScatter", c, n.ncclReduceScatter(send, recv, recvCount, t, op, c, s))
}

// AllGather gathers sendCount elements from every rank into recv, rank r's
// at block r.
func (n *NCCL) AllGather(send, recv driver.DevicePtr, sendCount uint64, t DataType, c Comm, s driver.Stream) error {
	return n.check("ncclAllGather", c, n.ncclAllGather(send, recv, sendCount, t, c, s))
}

// Broadcast copies count elements of root's send into every rank's recv.
func (n *NCCL) Broadcast(send, recv driver.DevicePtr, count uint64, t DataType, root int, c Comm, s driver.Stream) error {
	return n.check("ncclBroadcast", c, n.ncclBroadcast(send, recv, count, t, int32(root), c, s))
}

// Send sends count elements to peer; the peer must post a matching Recv.
func (n *NCCL) Send(send driver.DevicePtr, count uint64, t DataType, peer int, c Comm, s driver.Stream) error {
	return n.check("ncclSend", c, n.ncclSend(send, count, t, int32(peer), c, s))
}

// Recv receives count elements from peer.
func (n *NCCL) Recv(recv driver.DevicePtr, count uint64, t DataType, peer int, c Comm, s driver.Stream) error {
	return n.check("ncclRecv", c, n.ncclRecv(recv, count, t, int32(peer), c, s))
}

// GroupStart begins a group: the calls up to GroupEnd are issued together,
// which is how paired sends and receives avoid deadlock.
func (n *NCCL) GroupStart() error { return n.check("ncclGroupStart", 0, n.ncclGroupStart()) }

// GroupEnd issues the calls made since GroupStart.
func (n *NCCL) GroupEnd() error { return n.check("ncclGroupEnd", 0, n.ncclGroupEnd()) }

// AllToAll sends block j (count elements) of send to rank j and places the
// block received from rank i at block i of recv. send and recv must not
// overlap. It uses ncclAlltoAll where the library has it and a group of
// equal sends and receives otherwise.
func (n *NCCL) AllToAll(send, recv driver.DevicePtr, count uint64, t DataType, c Comm, s driver.Stream) error {
	if n.ncclAlltoAll != nil {
		return n.check("ncclAlltoAll", c, n.ncclAlltoAll(send, recv, count, t, c, s))
	}
	return n.allToAllP2P(send, recv, count, t, c, s)
}

func (n *NCCL) allToAllP2P(send, recv driver.DevicePtr, count uint64, t DataType, c Comm, s driver.Stream) error {
	size := t.Size()
	if size == 0 {
		return fmt.Errorf("nccl: all-to-all: unknown data type %d", t)
	}
	nranks, err := n.CommCount(c)
	if err != nil {
		return fmt.Errorf("nccl: all-to-all: %w", err)
	}
	chunk := count * size
	if err := n.GroupStart(); err != nil {
		return fmt.Errorf("nccl: all-to-all: %w", err)
	}
	var errs []error
	for p := 0; p < nranks; p++ {
		off := uint64(p) * chunk
		if err := n.Send(send.Add(off), count, t, p, c, s); err != nil {
			errs = append(errs, fmt.Errorf("nccl: all-to-all send to rank %d: %w", p, err))
			break
		}
		if err := n.Recv(recv.Add(off), count, t, p, c, s); err != nil {
			errs = append(errs, fmt.Errorf("nccl: all-to-all receive from rank %d: %w", p, err))
			break
		}
	}
	// The group is closed even after a failure, so NCCL is not left
	// inside it.
	if err := n.GroupEnd(); err != nil {
		errs = append(errs, fmt.Errorf("nccl: all-to-all: %w", err))
	}
	return errors.Join(errs...)
}
