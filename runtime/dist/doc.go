// Package dist places a process in a multi-process job and gives the
// processes of that job a place to meet.
//
// FromEnv reads where this process sits (its World) from the variables a
// launcher leaves behind: torchrun, Open MPI's mpirun, SLURM's srun, or
// none for a single process. DefaultToken derives the token that keeps
// processes of different jobs apart.
//
// The rendezvous store is a small key-value store over TCP, hosted by rank
// 0 (Serve, ServeNear) and used by every rank through a Client (Dial,
// DialNear). It hands out addresses and NCCL unique ids (Set, Get), lets
// processes compare fingerprints of their compiled plans, counts (Add) and
// synchronises (Barrier). Every call takes a context; a call that waits
// names what it waited for when its deadline passes, and every call
// returns promptly once the store's connection is gone.
//
// # Exit sequence
//
// The store lives in rank 0's process, so rank 0 must not close it while
// another rank still has a call in flight, or that rank would see the
// store vanish and fail a job that finished well. At exit:
//
//  1. every rank, rank 0 included: Client.Barrier(ctx, "exit", size), then
//     Client.Close;
//  2. rank 0 additionally: Server.WaitDrained(ctx, size) — which returns
//     once size clients have connected and all of them have gone — and
//     only then Server.Close.
//
// A rank that fails before the barrier makes the others' barrier time out
// instead of hang, as long as they pass a context with a deadline.
//
// # Trust
//
// The store authenticates connections by a token shared by the job (see
// DefaultToken), which never crosses the wire: the handshake is a
// challenge-response both ways (package auth, protocol in wire.go).
// Without GCOMPILE_TOKEN the token is derived from public facts about the
// job: it keeps a process of another job from joining by mistake, not an
// attacker. Frames after the handshake are neither encrypted nor
// authenticated. Whatever the token, nothing a peer sends can crash the
// server or make one connection block another.
package dist
