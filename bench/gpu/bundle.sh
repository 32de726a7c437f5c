#!/usr/bin/env bash
# Builds everything a GPU machine without a Go toolchain needs: the gcompile
# binary (no cgo, no CUDA library linked), the CUDA test binaries (their GPU
# tests run with GCOMPILE_GPU_TESTS=1), the models as .gir files (the loader
# needs Go to read model.go), a text corpus, and the PyTorch yardsticks. Run
# it from the repository root. The folder it writes (default gpu-bundle/,
# git-ignored) holds two files, small enough to travel where at most 64 MiB
# is carried: run.sh, and kit.tar.xz with all the rest, which run.sh unpacks
# beside itself before it runs anything (`bash run.sh unpack` only unpacks).
#
# Size: the binaries are stripped (-ldflags='-s -w': no symbol table or
# DWARF; panics still print file:line from the pclntab), and xz with a 64 MiB
# window sees the seven binaries' shared code (runtime, gcompile's packages)
# once: preset 1 packs the 85 MB into 13.7 MB in about 10 s on two cores,
# where -9 takes 50 s for 11.9 MB and the default -6, with its 8 MiB window,
# 16.4 MB. Unpacking takes a second.
#
# No -trimpath: it would shrink the binaries by 0.16 % but give every package
# other build-cache keys than `go test` uses, so the bundle's test in
# `make test` would compile the module a second time instead of linking.
set -euo pipefail
out=${1:-gpu-bundle}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
stage=$work/kit # what kit.tar.xz holds
rm -rf "$out"
mkdir -p "$out" "$stage/bin" "$stage/models"
export CGO_ENABLED=0
flags=(-ldflags='-s -w')
go build "${flags[@]}" -o "$stage/bin/gcompile" ./cmd/gcompile
for pkg in runtime/cuda runtime/cuda/driver runtime/cuda/nvrtc runtime/cuda/cublaslt runtime/cuda/nccl tests; do
	name=$(echo "$pkg" | tr / -)
	go test -c "${flags[@]}" -o "$stage/bin/$name.test" "./$pkg"
done
# Models: the equivalence-test GPT, the demo GPT and a 1.3B GPT at seq 2048
# (Narayanan et al.'s shape family: 24 layers, h=2048, 16 heads, V=51200).
gir() { # name batch set
	"$stage/bin/gcompile" examples/gpt/model.go --batch "$2" --set "$3" --dump "$work/$1" >"$work/$1.log" 2>&1 ||
		{ cat "$work/$1.log" >&2; return 1; }
	cp "$work/$1/00-input.gir" "$stage/models/$1.gir"
}
gir tiny 8 layers=2,hidden=32,heads=4,seq=16
gir demo 16 layers=2,hidden=128,heads=4,seq=64
gir gpt-1.3b-b4 4 layers=24,hidden=2048,heads=16,seq=2048,vocab=51200
# Corpus: the Go standard library's sources, 16 MiB (bytes ≥ 51200 are never
# produced, so the byte-level tokens fit every vocabulary here; cat's broken
# pipe when head has read enough is not an error).
{ find "$(go env GOROOT)/src" -name "*.go" -not -path "*/testdata/*" | sort | xargs cat 2>/dev/null || true; } | head -c $((16 << 20)) >"$stage/corpus.txt" || true
cp bench/gpu/*.py bench/torch_gpt.py "$stage/"
git rev-parse HEAD >"$stage/REVISION"
sizes() { # folder label: each file's size in bytes, then the total
	(cd "$1" && find . -type f -printf '%s\t%P\n' | sort -k2) |
		awk -F'\t' -v label="$2" '{ printf "%10d  %s\n", $1, $2; n += $1 } END { printf "%10d  %s\n", n, label }'
}
sizes "$stage" "in all, unpacked"
tar -C "$stage" --sort=name --owner=0 --group=0 --numeric-owner -cf - . | xz --lzma2=preset=1,dict=64MiB >"$out/kit.tar.xz"
cp bench/gpu/run.sh "$out/"
sizes "$out" "in all, in $out/ (what travels)"
