#!/usr/bin/env bash
# Step time of gcompile's CPU backend against PyTorch eager on the CPU:
# the same GPT (bench/torch_gpt.py mirrors examples/gpt/model.go), the same
# batch and sequence, fp32, on the same machine, in alternating runs so
# that load from anything else falls on both. Each figure is the median
# step time of steps WARMUP+1..STEPS of one run; the table shows the median
# over REPEAT runs and gcompile's time as a multiple of PyTorch's.
#
#   bash bench/cpu/compare.sh                 # every core
#   THREADS=1 bash bench/cpu/compare.sh       # one core for both
#
# PyTorch comes from Debian's python3-torch; its BLAS is whatever the
# libblas.so.3 alternative points at, so install libopenblas0-pthread
# first (the script refuses the reference BLAS, which is ~10x slower and
# would make the comparison meaningless).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out/bench-cpu}
THREADS=${THREADS:-$(nproc)}
STEPS=${STEPS:-25}
WARMUP=${WARMUP:-5}
REPEAT=${REPEAT:-3}
PY=${PY:-/usr/bin/python3}
mkdir -p "$OUT"
blas=$(readlink -f /usr/lib/x86_64-linux-gnu/libblas.so.3 2>/dev/null || true)
case "$blas" in
*openblas*) ;;
*) echo "PyTorch's BLAS is $blas, not OpenBLAS: apt-get install libopenblas0-pthread" >&2; exit 1 ;;
esac
CGO_ENABLED=0 go build -o "$OUT/gcompile" ./cmd/gcompile
# name | --set for gcompile | torch_gpt.py flags | batch
configs=(
	"demo|layers=2,hidden=128,heads=4,seq=64|--layers 2 --hidden 128 --heads 4 --seq 64|16"
	"l4-h256-s128|layers=4,hidden=256,heads=4,seq=128|--layers 4 --hidden 256 --heads 4 --seq 128|16"
)
median_steps() { # metrics.json → median ms of the steps after the warm-up
	"$PY" -c 'import json,statistics,sys; s=json.load(open(sys.argv[1]))["steps"][int(sys.argv[2]):]; print("%.1f" % statistics.median(x["ms"] for x in s))' "$1" "$WARMUP"
}
{
	echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)  revision: $(git rev-parse --short HEAD)$(git diff --quiet || echo '+dirty')"
	echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)  cores: $(nproc)  threads: $THREADS"
	echo "go: $(go version | cut -d' ' -f3)  torch: $("$PY" -c 'import torch; print(torch.__version__)')  blas: $blas"
} | tee "$OUT/compare.txt"
declare -A gc fu un pt
for ((r = 1; r <= REPEAT; r++)); do
	for c in "${configs[@]}"; do
		IFS='|' read -r name set tflags batch <<<"$c"
		# The model as written (fused attention), with --fuse, and with the
		# unfused attention composition PyTorch's script runs.
		for variant in plain fuse unfused; do
			flags=(--set "$set")
			case $variant in
			fuse) flags+=(--fuse) ;;
			unfused) flags=(--set "$set,attention=unfused") ;;
			esac
			GOMAXPROCS=$THREADS "$OUT/gcompile" examples/gpt/model.go --devices 1 --run --steps "$STEPS" \
				--batch "$batch" "${flags[@]}" --metrics "$OUT/m.json" >/dev/null 2>&1
			ms=$(median_steps "$OUT/m.json")
			case $variant in
			plain) gc[$name]+="$ms " ;;
			fuse) fu[$name]+="$ms " ;;
			unfused) un[$name]+="$ms " ;;
			esac
		done
		ms=$(OMP_NUM_THREADS=$THREADS "$PY" bench/torch_gpt.py --device cpu --threads "$THREADS" $tflags \
			--vocab 256 --batch "$batch" --steps $((STEPS - WARMUP)) --warmup "$WARMUP" |
			"$PY" -c 'import json,sys; print("%.1f" % json.loads(sys.stdin.read().split(" ", 1)[1])["median_step_ms"])')
		pt[$name]+="$ms "
		echo "run $r $name: gcompile ${gc[$name]}/ --fuse ${fu[$name]}/ unfused attention ${un[$name]}/ torch ${pt[$name]}" >&2
	done
done
med() { printf '%s\n' $1 | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
{
	echo "ms per step (median); in brackets, gcompile's time over PyTorch's"
	printf '%-14s %16s %16s %18s %10s\n' model gcompile "--fuse" "unfused attention" torch
	for c in "${configs[@]}"; do
		IFS='|' read -r name _ _ _ <<<"$c"
		g=$(med "${gc[$name]}") f=$(med "${fu[$name]}") u=$(med "${un[$name]}") p=$(med "${pt[$name]}")
		printf '%-14s %9s (%.2fx) %9s (%.2fx) %11s (%.2fx) %10s\n' "$name" "$g" "$(echo "$g / $p" | bc -l)" \
			"$f" "$(echo "$f / $p" | bc -l)" "$u" "$(echo "$u / $p" | bc -l)" "$p"
		echo "  runs: gcompile [${gc[$name]% }] --fuse [${fu[$name]% }] unfused [${un[$name]% }] torch [${pt[$name]% }]"
	done
} | tee -a "$OUT/compare.txt"
