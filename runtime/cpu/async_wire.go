package cpu

// This file is the exchange between the parameter server and its
// replicas. Every replica, in the server's process or another, takes each
// step's weights and hands in its gradients as the same two messages; a
// replica of another process sends them over the job's Comm, a replica of
// the server's process passes them by call. The protocol, for each step t
// and each replica r held by a process other than the server's (process
// 0, whose rank 0 speaks for the server):
//
//	r → 0  request   (tag t·3+0): t
//	0 → r  weights   (tag t·3+1): once version ≥ t−1−K exists, the newest
//	                              version, step t's loss scale and the raw
//	                              bytes of every param
//	r → 0  gradients (tag t·3+2): the loss, the replica's peak bytes and
//	                              the raw bytes of every boundary gradient
//
// (each tag offset by asyncTagBase). The server's process keeps one call
// on the comm outstanding for every such replica (serve): a receive of
// its request or of its gradients, never a wait of its own, so that a
// replica's process dying or stalling surfaces there within the comm's
// timeout, naming it, and the failure then wakes every other wait (fail).
// A request that cannot be answered yet is parked and answered by the
// update that publishes the version it needs, in the same critical
// section, so the loss scale it fixes is the one a replica of the
// server's process would fix. The replica's side waits only in comm calls.

import (
	"encoding/binary"
	"fmt"
	"math"

	"gcompile/ir"
	"gcompile/lower"
	"gcompile/runtime"
)

// asyncTagBase puts the protocol's tags apart from every other user of a
// job's comm: pipeline transfers are tagged with value ids (small and
// non-negative) and the host's exchanges with negative numbers; the
// tags of steps below 2^38 stay below 2^41.
const asyncTagBase = 1 << 40

// The messages of one step, in the order a replica sees them.
const (
	tagRequest = iota
	tagWeights
	tagGradients
	asyncTagKinds
)

// asyncTag is the tag of step t's message of kind.
func asyncTag(t, kind int) int { return asyncTagBase + t*asyncTagKinds + kind }

// asyncHeader is the bytes before the tensors in a weights message (the
// version, int64; the loss scale, float64) and a gradients message (the
// loss, float64; the peak bytes, int64), little-endian.
const asyncHeader = 16

// asyncSpan is one tensor in a message: its bytes [off, end) and the
// gradient program's buffer it comes from or goes to.
type asyncSpan struct {
	off, end int
	buf      lower.Buffer
}

// asyncWire lays out the messages: the same on every process, since
// every process compiled the same gradient program.
type asyncWire struct {
	params, grads        []asyncSpan
	weightsLen, gradsLen int
}

func newAsyncWire(grad *lower.Program, params, boundary []string) (asyncWire, error) {
	var w asyncWire
	off := asyncHeader
	for _, name := range params {
		b := grad.Buffers[grad.Sources[name]]
		w.params = append(w.params, asyncSpan{off: off, end: off + int(b.Bytes), buf: b})
		off += int(b.Bytes)
	}
	w.weightsLen = off
	off = asyncHeader
	for _, name := range boundary {
		id, ok := grad.Outputs[name]
		if !ok {
			return w, fmt.Errorf("boundary gradient %q is not an output of the gradient program", name)
		}
		b := grad.Buffers[id]
		w.grads = append(w.grads, asyncSpan{off: off, end: off + int(b.Bytes), buf: b})
		off += int(b.Bytes)
	}
	w.gradsLen = off
	return w, nil
}

// weights fills dst, weightsLen bytes, with the server's params at
// version and the loss scale.
func (w asyncWire) weights(dst []byte, server *Device, params []string, version int, scale float64) error {
	binary.LittleEndian.PutUint64(dst[0:], uint64(version))
	binary.LittleEndian.PutUint64(dst[8:], math.Float64bits(scale))
	for i, name := range params {
		raw, _, err := server.Bytes(name)
		if err != nil {
			return err
		}
		s := w.params[i]
		if len(raw) != s.end-s.off {
			return fmt.Errorf("param %q: the server holds %d bytes, a replica %d", name, len(raw), s.end-s.off)
		}
		copy(dst[s.off:s.end], raw)
	}
	return nil
}

// weightsHeader reads a weights message's version and loss scale.
func (w asyncWire) weightsHeader(msg []byte) (version int, scale float64) {
	return int(binary.LittleEndian.Uint64(msg[0:])), math.Float64frombits(binary.LittleEndian.Uint64(msg[8:]))
}

// param is the i-th param's bytes in a weights message.
func (w asyncWire) param(msg []byte, i int) []byte { return msg[w.params[i].off:w.params[i].end] }

// gradients is a fresh gradients message of replica d after its step.
func (w asyncWire) gradients(d *Device, loss float64) []byte {
	msg := make([]byte, w.gradsLen)
	binary.LittleEndian.PutUint64(msg[0:], math.Float64bits(loss))
	binary.LittleEndian.PutUint64(msg[8:], uint64(d.PeakBytes()))
	for _, s := range w.grads {
		copy(msg[s.off:s.end], d.raw(s.buf))
	}
	return msg
}

// gradient decodes the i-th boundary gradient of a gradients message, as
// the replica's Float64s would have read it.
func (w asyncWire) gradient(msg []byte, i int) ([]float64, error) {
	s := w.grads[i]
	return runtime.Decode(s.buf.Type, msg[s.off:s.end])
}

func (w asyncWire) gradientsLoss(msg []byte) float64 {
	return math.Float64frombits(binary.LittleEndian.Uint64(msg[0:]))
}

func (w asyncWire) gradientsPeak(msg []byte) int64 {
	return int64(binary.LittleEndian.Uint64(msg[8:]))
}

// serverRank is the rank that speaks for the server: process 0's first.
func (a *Async) serverRank() int { return a.job.Layout.Lead(0) }

// where names replica r's rank and process, for errors.
func (a *Async) where(r int) string {
	return fmt.Sprintf("rank %d, process %d", r, a.job.Layout.ProcOf(r))
}

// fetch puts replica r's weights for step t into msg: by call on the
// server's process, where the wait is on the server's progress, which
// ends by an update or a failure; else by request over the comm, whose
// timeout bounds the wait. errStopped: the run failed elsewhere.
func (a *Async) fetch(r, t int, msg []byte) error {
	if a.Server != nil {
		a.mu.Lock()
		defer a.mu.Unlock()
		for a.err == nil && a.version < t-1-a.k && t <= a.end {
			a.cond.Wait()
		}
		if a.err != nil || t > a.end {
			return errStopped
		}
		return a.weightsLocked(r, t, msg)
	}
	c, s := a.job.Comm, a.serverRank()
	var req [8]byte
	binary.LittleEndian.PutUint64(req[:], uint64(t))
	if err := c.Send(r, s, asyncTag(t, tagRequest), ir.U8, req[:]); err != nil {
		return fmt.Errorf("asking the parameter server (rank %d) for weights: %w", s, err)
	}
	if err := c.Recv(s, r, asyncTag(t, tagWeights), ir.U8, msg); err != nil {
		return fmt.Errorf("waiting for weights from the parameter server (rank %d): %w", s, err)
	}
	return nil
}

// stopPeak marks the gradients message a replica of another process sends
// in place of step t's gradients when it was told to stop before step t:
// the server's receive for it ends, and nothing follows.
const stopPeak = -1

// stopped answers a stop for step t: a message for the server's pending
// receive of step t's gradients.
func (a *Async) stopped(r, t int) error {
	msg := make([]byte, a.wire.gradsLen)
	peak := int64(stopPeak)
	binary.LittleEndian.PutUint64(msg[8:], uint64(peak))
	return a.push(r, t, msg)
}

// push hands replica r's step-t gradients message to the server.
func (a *Async) push(r, t int, msg []byte) error {
	if a.Server != nil {
		return a.deposit(r, t, msg)
	}
	s := a.serverRank()
	if err := a.job.Comm.Send(r, s, asyncTag(t, tagGradients), ir.U8, msg); err != nil {
		return fmt.Errorf("sending gradients to the parameter server (rank %d): %w", s, err)
	}
	return nil
}

// serve is the server's side of replica r on another process, from step
// first to the run's end: it takes each request, answers it now or parks
// it for the update that publishes the version it needs, and files the
// gradients. Between the two receives nothing waits, so a receive on the
// comm is always outstanding for r until its last step. A request past
// the end (the run stopped early) is answered with a stop.
func (a *Async) serve(r, first, last int) error {
	c, s := a.job.Comm, a.serverRank()
	req := make([]byte, 8)
	for t := first; t <= last; t++ {
		if err := c.Recv(r, s, asyncTag(t, tagRequest), ir.U8, req); err != nil {
			return fmt.Errorf("waiting for its request for step %d's weights: %w", t, err)
		}
		if got := int(binary.LittleEndian.Uint64(req)); got != t {
			return fmt.Errorf("%w: it asked for step %d's weights where step %d's were due", runtime.ErrMismatch, got, t)
		}
		a.mu.Lock()
		if a.err != nil {
			a.mu.Unlock()
			return nil
		}
		a.pending[r] = t
		err := a.answerLocked()
		a.mu.Unlock()
		if err != nil {
			return err
		}
		msg := make([]byte, a.wire.gradsLen)
		if err := c.Recv(r, s, asyncTag(t, tagGradients), ir.U8, msg); err != nil {
			return fmt.Errorf("waiting for its step %d gradients: %w", t, err)
		}
		if a.wire.gradientsPeak(msg) == stopPeak {
			return nil // it was told to stop, and asks no more
		}
		if err := a.deposit(r, t, msg); err != nil {
			return err
		}
	}
	return nil
}

// answerLocked sends the weights every parked request may now have, in
// replica order; the caller holds a.mu. Sends are buffered, so none
// waits here.
func (a *Async) answerLocked() error {
	for r, t := range a.pending {
		if t == 0 || a.version < t-1-a.k && t <= a.end {
			continue
		}
		msg := make([]byte, a.wire.weightsLen)
		if t > a.end {
			stop := int64(stopVersion)
			binary.LittleEndian.PutUint64(msg, uint64(stop))
		} else if err := a.weightsLocked(r, t, msg); err != nil {
			return err
		}
		s := a.serverRank()
		if err := a.job.Comm.Send(s, r, asyncTag(t, tagWeights), ir.U8, msg); err != nil {
			return fmt.Errorf("sending step %d's weights to replica %d (%s): %w", t, r, a.where(r), err)
		}
		a.pending[r] = 0
	}
	return nil
}
