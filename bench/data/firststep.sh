#!/usr/bin/env bash
# Time to the first step and peak RSS of a run on a small and on a large
# token dataset: opening a dataset, building its sample index once and
# reusing it must not grow with its size. Writes the raw figures to stdout.
#
#   bash bench/data/firststep.sh WORKDIR   (needs about 11 GB free in WORKDIR)
#
# The datasets are random ids (tools/synthdata): tokenizing 10 GB of text
# takes an hour, and nothing past the tokenizer can tell the difference.
set -euo pipefail
work=${1:?usage: firststep.sh WORKDIR}
cd "$(dirname "$0")/../.."
mkdir -p "$work"
go build -o "$work/gcompile" ./cmd/gcompile
go build -o "$work/synthdata" ./tools/synthdata
# 10 MB and 10.8 GB of uint16 tokens.
[ -f "$work/small.idx" ] || "$work/synthdata" -tokens 5e6 -out "$work/small"
[ -f "$work/big.idx" ] || "$work/synthdata" -tokens 5.4e9 -out "$work/big"
ls -l "$work"/small.bin "$work"/big.bin
# The model as a dump with the data's padded vocabulary, so that no run
# pays for a Go build.
"$work/gcompile" examples/gpt/model.go --set vocab=50304 --dump "$work/model" >/dev/null 2>&1
echo "date: $(date -u +%FT%TZ)  cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)  cores: $(nproc)"
for size in small big; do
	rm -rf "$work/cache-$size"
	for attempt in first-run reused-index; do
		sync
		/usr/bin/time -f "$size $attempt: %e s wall, %M KiB max RSS" \
			"$work/gcompile" "$work/model/00-input.gir" --run --steps 1 --eval-batches -1 \
			--data "$work/$size" --data-cache-dir "$work/cache-$size" 2>&1 |
			grep -E "^(small|big) |^data |^step 1/"
	done
done
