// Package nccl binds NCCL, NVIDIA's collective communication library,
// through purego (no cgo), so gcompile keeps building as one binary with
// CGO_ENABLED=0 and only needs libnccl on machines that run multi-GPU jobs.
//
// It provides what the CUDA backend's Comm needs: a unique id from one rank
// shared with the others (its bytes travel by whatever means the launcher
// has), communicator creation per rank, the collectives the compiler's
// redistribution table emits (all-reduce, reduce-scatter, all-gather,
// broadcast, all-to-all) and grouped point-to-point send/recv for pipeline
// stages, all queued on a CUDA stream; and what failure handling needs:
// CommAbort, which may be called from another thread to free a
// communicator whose calls are stuck (they then fail, and so do the other
// ranks' calls that need this one), and CommGetAsyncError, which reports an
// error that arose outside any call, such as a peer process that died.
//
// Two entry points are optional, bound only where the library has them:
// CommSplit (ncclCommSplit, NCCL 2.18), which forms sub-communicators from
// an existing one by color and key, and CommInitRankScalable
// (ncclCommInitRankScalable, NCCL 2.23). HasCommSplit and
// HasCommInitRankScalable report them; without them the methods return an
// error wrapping errors.ErrUnsupported. Both pass a NULL ncclConfig_t*,
// NCCL's default configuration.
//
// ncclUniqueId is a 128-byte struct that ncclCommInitRank takes by value.
// On linux/amd64 the System V ABI passes a struct that large in memory, on
// the stack; purego copies a Go struct argument there (in 8-byte words, in
// field order), so UniqueID mirrors the C struct exactly and is passed as a
// value. The tests check the bytes that arrive in C.
//
// ncclAlltoAll exists only in recent NCCL (2.28 and later). Where it is
// missing, AllToAll is done as NCCL's documentation describes: a group of
// one send and one receive of equal size per peer.
//
// NCCL calls return as soon as the work is queued; errors a collective meets
// while running surface later. A failed call is an *Error with NCCL's text
// for the code and, where the library has ncclGetLastError, its description
// of what went wrong.
package nccl
