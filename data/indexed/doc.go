// Package indexed reads and writes token datasets in Megatron-LM's indexed
// format (the "MMIDIDX" files of megatron/core/datasets/indexed_dataset.py),
// so that a dataset made by Megatron's tools/preprocess_data.py trains here
// unchanged, and one made here trains under Megatron-LM.
//
// A dataset is two files sharing a prefix. PREFIX.bin holds every token of
// every sequence back to back, little-endian, in one integer type (the
// dtype). PREFIX.idx describes it, all integers little-endian:
//
//	offset  size        field
//	0       9           magic "MMIDIDX\x00\x00"
//	9       8           version, uint64, always 1
//	17      1           dtype code, uint8 (table below)
//	18      8           sequence count S, uint64
//	26      8           document count D, uint64: the length of the
//	                    document indices array, one more than the number
//	                    of documents
//	34      4·S         sequence lengths in tokens, int32
//	34+4S   8·S         sequence byte offsets into PREFIX.bin, int64
//	34+12S  8·D         document indices, int64: document d is sequences
//	                    [indices[d], indices[d+1])
//
// The dtype codes are Megatron's DType enum:
//
//	1 uint8   2 int8   3 int16   4 int32   5 int64   6 float64
//	7 float32 (older Megatron versions wrote np.double, float64, here)
//	8 uint16
//
// Token ids are integers, so the float codes are refused by Open and Create
// with ErrDType; every integer code is read.
//
// Megatron writes one sequence per document unless sentences were split
// (then a document spans several sequences, and an empty document has
// none: two equal consecutive indices). Writer writes one sequence per
// document; Open reads both shapes.
//
// Open refuses anything but the exact layout Megatron writes: the byte
// offsets must start at 0 and each must follow the previous sequence
// (offset[i+1] = offset[i] + length[i]·itemsize), and PREFIX.bin must be
// exactly as long as the sequences together. Megatron's own reader would
// accept gaps or overlaps, but no tool writes them, and a file that breaks
// the rule is almost always truncated or paired with the wrong .idx. The
// checks cost one pass over the .idx (O(sequences)) and never touch
// PREFIX.bin's contents, so opening a dataset of any size takes the same
// time; both files are memory-mapped, so the process's memory does not
// grow with the dataset either. Multimodal datasets (an extra int8 mode per
// sequence after the document indices) are not supported and are named as
// such.
package indexed
