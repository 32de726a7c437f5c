// Package comm holds the transports behind runtime.Comm: Local, for the
// devices of one process (shared memory), and Net, for devices spread over
// processes and machines (TCP between processes, shared memory inside
// one). Both add reductions in group-position order, so a plan gives the
// same bits whichever transport runs it, and both fail every member of a
// call whose arguments disagree, or that waits past the timeout, instead
// of hanging.
//
// The typed helpers (AllReduce, AllGather, Send, …) call a runtime.Comm on
// Go slices.
package comm
