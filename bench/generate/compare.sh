#!/usr/bin/env bash
# Decode speed against the prompt's length, gcompile's CPU backend beside
# PyTorch eager (Debian's python3-torch at /usr/bin/python3) on the same
# threads: BenchmarkDecode (tests/generate_bench_test.go) and
# bench/generate/torch_decode.py, the same models (examples/gpt's and
# examples/llama's defaults), one sequence, float32.
#
#   bash bench/generate/compare.sh [THREADS] > bench/results/generate-DATE.txt
set -euo pipefail
cd "$(dirname "$0")/../.."
threads=${1:-2}
lens=${GCOMPILE_BENCH_PROMPTS:-64,256,1024,4096}
echo "# $(date -u +%F) $(uname -m), $(nproc) cores: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo "# $(go version); torch $(/usr/bin/python3 -c 'import torch; print(torch.__version__)'); threads $threads; prompt lengths $lens"
echo "## gcompile (GOMAXPROCS=$threads): go test ./tests/ -run '^\$' -bench BenchmarkDecode -benchtime 200x -count 3"
GCOMPILE_BENCH_PROMPTS=$lens GOMAXPROCS=$threads go test ./tests/ -run '^$' -bench BenchmarkDecode -benchtime 200x -count 3 | grep -E '^Benchmark'
echo "## PyTorch eager: torch_decode.py --threads $threads --new-tokens 64 --repeat 3"
/usr/bin/python3 bench/generate/torch_decode.py --threads "$threads" --prompt-lens "$lens" --new-tokens 64 --repeat 3 | grep -v '^\['
