#!/usr/bin/env bash
# Runs on the GPU machine from inside the bundle folder (bench/gpu/bundle.sh
# builds it): the CUDA tests on the real device, the CUDA backend against the
# CPU backend, cuBLASLt GEMM against PyTorch's matmul, and the GPT step time
# against PyTorch eager on the same model. Raw output goes to $OUT (default
# ./out); the last lines printed are a summary. First it unpacks kit.tar.xz
# beside itself (bin/, models/, corpus.txt, the yardsticks); `bash run.sh
# unpack` stops there, for running the binaries by hand.
set -uo pipefail
cd "$(dirname "$0")"
# tar calls xz, which a slim image may lack; Python, there for PyTorch, reads
# .tar.xz itself (tarfile with lzma). No Go is needed.
if [ -f kit.tar.xz ]; then
	if command -v xz >/dev/null && tar -xJf kit.tar.xz; then
		:
	elif python3 -c 'import sys, tarfile
with tarfile.open(sys.argv[1]) as t:
    t.extractall(".", **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))' kit.tar.xz; then
		:
	else
		echo "run.sh: cannot unpack kit.tar.xz: needs tar and xz, or python3 with lzma" >&2
		exit 1
	fi
elif [ ! -x bin/gcompile ]; then
	echo "run.sh: neither kit.tar.xz nor bin/gcompile is here; make gpu-bundle builds them" >&2
	exit 1
fi
[ "${1:-}" = unpack ] && exit 0
OUT=${OUT:-out}
mkdir -p "$OUT"
log() { tee -a "$OUT/run.log"; }
export GCOMPILE_GPU_TESTS=1 GCOMPILE_CACHE="$OUT/cubin-cache"
{
	echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)  revision: $(cat REVISION 2>/dev/null)"
	nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv
	python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
} 2>&1 | log
# Python wheels carry cuBLASLt, NVRTC and NCCL; the driver comes from the system.
site=$(python3 -c 'import site; print(site.getsitepackages()[0])' 2>/dev/null || true)
export GCOMPILE_PYTHON_SITE=$site

step() { echo "=== $*" | log; }
step "CUDA binding and backend tests on the device"
for t in bin/*.test; do
	[ "$t" = bin/tests.test ] && continue
	"./$t" -test.count=1 -test.v 2>&1 | grep -E '^(=== RUN|--- |PASS|FAIL|ok|panic)|gpu_test|GPU' | log
done
step "Equivalence: CUDA backend vs CPU backend"
./bin/tests.test -test.count=1 -test.run 'CUDAMatchesCPUOnGPU' -test.v 2>&1 | grep -vE '^=== RUN' | log
step "GEMM: cuBLASLt through gcompile vs PyTorch matmul, 8192^3"
./bin/runtime-cuda-cublaslt.test -test.run '^$' -test.bench 'GEMM' -test.count 5 -test.benchtime 50x 2>&1 | log
python3 torch_gemm.py --sizes 8192 2>&1 | log
step "GPT step time: gcompile's CUDA backend vs PyTorch eager, same model, bf16"
for cfg in "layers=24,hidden=1024,heads=16,seq=2048,vocab=51200" "layers=24,hidden=2048,heads=16,seq=2048,vocab=51200"; do
	GCOMPILE_GPT=$cfg GCOMPILE_GPT_BATCH=4 ./bin/tests.test -test.run '^$' -test.bench 'CUDAGPTStep' \
		-test.count 3 -test.benchtime 10x 2>&1 | log
done
python3 torch_gpt.py --layers 24 --hidden 1024 --heads 16 --batch 4 2>&1 | log
python3 torch_gpt.py --layers 24 --hidden 2048 --heads 16 --batch 4 2>&1 | log
python3 torch_gpt.py --layers 24 --hidden 2048 --heads 16 --batch 4 --attention sdpa 2>&1 | log
step "The CLI end to end on the GPU (1.3B, bf16, 20 steps, metrics JSON)"
./bin/gcompile models/gpt-1.3b-b4.gir --backend cuda --precision bf16 --run --steps 20 \
	--eval-batches 1 --data corpus.txt --metrics "$OUT/gcompile-1.3b.json" 2>&1 | tail -5 | log
