// Package checkpoint reads and writes model weights in the safetensors
// format, so that `gcompile --save` produces files that PyTorch and the
// Hugging Face safetensors libraries load directly, and `gcompile --load`
// accepts weights trained elsewhere.
//
// The format was chosen over an ad-hoc one because it is trivial to parse
// safely: an 8-byte little-endian header length, a JSON header mapping each
// tensor name to its dtype, shape and byte range, then the raw
// little-endian, row-major data. Nothing in a file is executed, and every
// byte range can be checked against the file size before it is read.
//
// Writing is deterministic (tensors are laid out in name order and the
// header keys are sorted), so the same weights always give the same bytes
// and checkpoints can be compared with a checksum. Reading validates the
// whole header before touching the data and reports which rule a file
// broke; each rule has a sentinel error for errors.Is.
package checkpoint
