#!/usr/bin/env bash
# Builds everything a GPU machine without a Go toolchain needs into one
# folder (default gpu-bundle/, git-ignored): the static gcompile binary,
# the CUDA test binaries (their GPU tests run with GCOMPILE_GPU_TESTS=1),
# the models as .gir files (the loader needs Go to read model.go), a text
# corpus, and the PyTorch yardsticks. Run it from the repository root.
set -euo pipefail
out=${1:-gpu-bundle}
rm -rf "$out"
mkdir -p "$out/bin" "$out/models"
export CGO_ENABLED=0
go build -o "$out/bin/gcompile" ./cmd/gcompile
for pkg in runtime/cuda runtime/cuda/driver runtime/cuda/nvrtc runtime/cuda/cublaslt runtime/cuda/nccl tests; do
	name=$(echo "$pkg" | tr / -)
	go test -c -o "$out/bin/$name.test" "./$pkg"
done
# Models: the equivalence-test GPT, the demo GPT and a 1.3B GPT at seq 2048
# (Narayanan et al.'s shape family: 24 layers, h=2048, 16 heads, V=51200).
gir() { # name batch set
	local tmp
	tmp=$(mktemp -d)
	go run ./cmd/gcompile examples/gpt/model.go --batch "$2" --set "$3" --dump "$tmp" >/dev/null
	cp "$tmp/00-input.gir" "$out/models/$1.gir"
	rm -rf "$tmp"
}
gir tiny 8 layers=2,hidden=32,heads=4,seq=16
gir demo 16 layers=2,hidden=128,heads=4,seq=64
gir gpt-1.3b-b4 4 layers=24,hidden=2048,heads=16,seq=2048,vocab=51200
# Corpus: the Go standard library's sources, 16 MiB (bytes ≥ 51200 are never
# produced, so the byte-level tokens fit every vocabulary here).
{ find "$(go env GOROOT)/src" -name "*.go" -not -path "*/testdata/*" | sort | xargs cat || true; } | head -c $((16 << 20)) >"$out/corpus.txt" || true
cp bench/gpu/*.py bench/torch_gpt.py bench/gpu/run.sh "$out/"
git rev-parse HEAD >"$out/REVISION"
du -sh "$out"
