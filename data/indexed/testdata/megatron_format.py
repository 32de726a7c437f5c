#!/usr/bin/env python3
"""Megatron-LM's indexed dataset (MMIDIDX) in plain Python, for interop tests.

This follows the layout of megatron/core/datasets/indexed_dataset.py
(IndexedDatasetBuilder, _IndexWriter, _IndexReader) with the standard
library only, so the Go tests can check both directions without numpy:

  megatron_format.py write PREFIX [DTYPE]   write PREFIX.bin/.idx holding DOCUMENTS
  megatron_format.py read PREFIX            print the dataset as JSON

DTYPE is uint16 (the default) or int32, the two types Megatron's
DType.optimal_dtype picks for token ids. The JSON printed by read
is {"dtype": NAME, "sequences": [[ids...]...], "document_indices": [...]}.
"""

import array
import json
import struct
import sys

HEADER = b"MMIDIDX\x00\x00"

# Megatron's DType enum: code -> (numpy name, array typecode, itemsize).
DTYPES = {
    1: ("uint8", "B", 1),
    2: ("int8", "b", 1),
    3: ("int16", "h", 2),
    4: ("int32", "i", 4),
    5: ("int64", "q", 8),
    6: ("float64", "d", 8),
    7: ("float32", "f", 4),
    8: ("uint16", "H", 2),
}
CODES = {name: code for code, (name, _, _) in DTYPES.items()}

# The documents written by `write`, each a list of sequences, as Megatron's
# builder receives them: a document split into sentences has several
# sequences, an empty text gives a document with none (preprocess_data.py
# appends no end-of-document token to it), and add_item may add an empty
# sequence. The last document holds the largest ids each dtype can take.
DOCUMENTS = {
    "uint16": [
        [[1, 2, 3, 50256]],
        [[10, 11], [12, 13, 14, 50256]],
        [],
        [[], [7, 8, 50256]],
        [[0, 65535, 256, 50256]],
    ],
    "int32": [
        [[1, 2, 3, 100000]],
        [[10, 11], [12, 13, 14, 100000]],
        [],
        [[], [7, 8, 100000]],
        [[0, 2147483647, 65536, 100000]],
    ],
}


def typed(code, values):
    a = array.array(DTYPES[code][1], values)
    assert a.itemsize == DTYPES[code][2], "unexpected C type size on this platform"
    if sys.byteorder == "big":
        a.byteswap()
    return a


def write(prefix, dtype):
    code = CODES[dtype]
    itemsize = DTYPES[code][2]
    sequence_lengths = []
    document_indices = [0]
    with open(prefix + ".bin", "wb") as data_file:
        for document in DOCUMENTS[dtype]:
            for sequence in document:
                data_file.write(typed(code, sequence).tobytes())
                sequence_lengths.append(len(sequence))
            document_indices.append(len(sequence_lengths))
    sequence_pointers = []
    pointer = 0
    for length in sequence_lengths:
        sequence_pointers.append(pointer)
        pointer += length * itemsize
    with open(prefix + ".idx", "wb") as idx:
        idx.write(HEADER)
        idx.write(struct.pack("<Q", 1))
        idx.write(struct.pack("<B", code))
        idx.write(struct.pack("<Q", len(sequence_lengths)))
        idx.write(struct.pack("<Q", len(document_indices)))
        idx.write(typed(4, sequence_lengths).tobytes())
        idx.write(typed(5, sequence_pointers).tobytes())
        idx.write(typed(5, document_indices).tobytes())


def read(prefix):
    with open(prefix + ".idx", "rb") as f:
        raw = f.read()
    assert raw[:9] == HEADER, "bad header, cannot read: " + prefix + ".idx"
    (version,) = struct.unpack_from("<Q", raw, 9)
    assert version == 1, "bad version, cannot read: " + prefix + ".idx"
    (code,) = struct.unpack_from("<B", raw, 17)
    name, typecode, itemsize = DTYPES[code]
    sequence_count, document_count = struct.unpack_from("<QQ", raw, 18)
    offset = 34

    def take(typecode, count):
        nonlocal offset
        a = array.array(typecode)
        a.frombytes(raw[offset : offset + count * a.itemsize])
        if sys.byteorder == "big":
            a.byteswap()
        offset += count * a.itemsize
        return list(a)

    sequence_lengths = take("i", sequence_count)
    sequence_pointers = take("q", sequence_count)
    document_indices = take("q", document_count)
    assert offset == len(raw), "trailing bytes in " + prefix + ".idx"
    assert document_indices[-1] == sequence_count
    with open(prefix + ".bin", "rb") as f:
        data = f.read()
    sequences = []
    for pointer, length in zip(sequence_pointers, sequence_lengths):
        a = array.array(typecode)
        a.frombytes(data[pointer : pointer + length * itemsize])
        if sys.byteorder == "big":
            a.byteswap()
        sequences.append(list(a))
    json.dump(
        {"dtype": name, "sequences": sequences, "document_indices": document_indices},
        sys.stdout,
    )
    sys.stdout.write("\n")


def main(argv):
    if len(argv) in (3, 4) and argv[1] == "write" and (len(argv) == 3 or argv[3] in DOCUMENTS):
        write(argv[2], argv[3] if len(argv) > 3 else "uint16")
    elif len(argv) == 3 and argv[1] == "read":
        read(argv[2])
    else:
        sys.stderr.write(__doc__)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
