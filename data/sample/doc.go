// Package sample draws Megatron-LM-style GPT training samples from a token
// dataset: windows of seq+1 tokens packed across document boundaries, the
// documents of a split shuffled per epoch, the windows shuffled per epoch,
// and several datasets blended by weight.
//
// The one property everything here serves is that sample k of a run is a
// pure function of (dataset, split, seq, seed, k). Nothing depends on how
// many samples the run will need, on which process asks, or on the order in
// which samples are asked for, so a resumed run with more steps, a job of
// several processes each drawing only its own rows, and a rerun all see the
// same tokens.
//
// # Epochs
//
// Sample k belongs to epoch e = k / S, where S = (tokens of the split - 1)
// / seq is SamplesPerEpoch: the tokens left over at the end of an epoch's
// document stream are dropped, as Megatron's GPTDataset drops them. Within
// epoch e the documents of the split are put in an order drawn from
// (seed, e), concatenated, and cut into S windows: window j holds tokens
// [j*seq, j*seq+seq+1) of that stream, so consecutive windows share one
// token. The windows are then visited in an order also drawn from
// (seed, e). Each epoch is built on its own, so an epoch never depends on
// how many epochs a run will need (Megatron instead shuffles the documents
// of all requested epochs together, which ties every sample to the run's
// length).
//
// Both orders come from Fisher–Yates shuffles driven by math/rand/v2's PCG
// generator, seeded with (uint64(seed), mix(2*e)) for the document order
// and (uint64(seed), mix(2*e+1)) for the window order, where mix is the
// SplitMix64 finaliser. Bounded draws use Lemire's multiply-and-reject
// method on PCG.Uint64, written out here rather than taken from
// rand.Rand, so the orders stay the same when the standard library changes
// how it maps random bits to ranges: a cache index or a resumed run must
// agree with one built by an older binary.
//
// A held-out split is drawn unshuffled (Config.Shuffle false): windows in
// document order, no seed involved, so evaluation losses compare across
// runs and seeds.
//
// # The index cache
//
// For each (dataset identity, document range, seq, seed, epoch) an index
// file holds that epoch's document order, the start (position in the
// document order, offset in the document) of every window and the window
// order — Megatron's doc_idx, sample_idx and shuffle_idx. It is built the
// first time a run touches the epoch, written to a temporary file and
// renamed into place (processes building the same file at once all write
// identical bytes; one rename wins), and memory-mapped on later use, so a
// lookup touches a few pages whatever the size of the dataset. The file
// name carries a hash of everything that determines the content, plus a
// format version; the header repeats the whole hash and every count, and
// carries a CRC-32C of the body. Both are checked when the file is opened
// (the checksum reads the file once, a fraction of a second for hundreds
// of MB), since a value overwritten by another in-range value would
// otherwise give other samples without any error. Every value a lookup
// reads is also checked against the dataset's bounds. A file that fails a
// check is rebuilt, never trusted.
//
// The number of tokens of each document range is cached the same way, so a
// run that reuses its index reads neither the document lengths of the whole
// dataset nor anything else whose size grows with it.
//
// # Blends
//
// A blend assigns global sample k to one dataset and to that dataset's own
// next sample number through a fixed binary tree of two-way splits (see
// Blend), so the datasets' shares of any prefix of samples are within about
// one sample of the weights and a lookup costs O(log parts) for any k.
package sample
