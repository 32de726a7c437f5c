// Package runtime executes lowered programs and measures them. It holds
// what every backend shares: the Device interface a backend implements,
// the Comm interface that moves data between the global ranks of a job
// (transports in runtime/comm), the Layout and Job that say which devices
// a process holds in a run of several processes, the host's view of a
// device's buffers (HostView), the cluster logic every backend embeds
// (MeshCluster: stepping devices, splitting and assembling tensors by
// placement, reading outputs and gathering tensors across processes), the
// peak meter, the training loop (learning-rate schedule, data feeding,
// evaluation), the metrics JSON of the CLI contract and Chrome trace
// output. Backends live in sub-packages: runtime/cpu (virtual CPU devices)
// and runtime/cuda (NVIDIA GPUs); runtime/dist finds a process's place in
// a job and hosts the rendezvous; checkpoints (safetensors) are in
// runtime/checkpoint.
package runtime
