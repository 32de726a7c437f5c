#!/usr/bin/env bash
# The cost model against measured step times on the CPU backend: for each
# plan of the demo-sized GPT on 4 and 8 virtual devices, the step time
# `--plan --hardware cpu` predicts (every axis fixed, so the table's
# first row is that plan; the cpu preset calibrates itself first) beside
# the median measured step of a short run. Prints both per plan, the mean
# absolute % error and Spearman's rank correlation.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out/bench-plans}
STEPS=${STEPS:-10}
# HARDWARE: the preset to predict with (cpu calibrates this machine first;
# a JSON file, e.g. one --save-hardware refined from a trace, is used as is).
HARDWARE=${HARDWARE:-cpu}
mkdir -p "$OUT"
CGO_ENABLED=0 go build -o "$OUT/gcompile" ./cmd/gcompile
# MODEL=moe: the MoE example (8 experts, every other block) over plans
# that split it by ep, dp and tp instead.
MODEL=${MODEL:-gpt}
plans=(
	"--devices 4 --dp 4"
	"--devices 4 --dp 4 --zero 1"
	"--devices 4 --dp 4 --zero 3"
	"--devices 4 --dp 4 --recompute full"
	"--devices 4 --tp 2 --dp 2"
	"--devices 4 --tp 4 --dp 1"
	"--devices 4 --tp 2 --dp 2 --sequence-parallel"
	"--devices 4 --tp 2 --dp 2 --microbatches 2"
	"--devices 4 --pp 2 --dp 2 --microbatches 4"
	"--devices 4 --pp 2 --tp 2 --dp 1 --microbatches 4"
	"--devices 4 --pp 2 --dp 2 --microbatches 8 --recompute full"
	"--devices 8 --dp 8"
	"--devices 8 --tp 2 --dp 4"
	"--devices 8 --pp 2 --tp 2 --dp 2 --microbatches 4"
)
common=(examples/gpt/model.go --batch 16)
if [ "$MODEL" = moe ]; then
	plans=(
		"--devices 4 --dp 4"
		"--devices 4 --ep 2 --dp 2"
		"--devices 4 --ep 4 --dp 1"
		"--devices 4 --tp 2 --ep 2 --dp 1"
		"--devices 4 --ep 2 --dp 2 --zero 1"
		"--devices 4 --pp 2 --ep 2 --dp 1 --microbatches 4"
		"--devices 8 --dp 8"
		"--devices 8 --ep 2 --dp 4"
		"--devices 8 --ep 4 --dp 2"
		"--devices 8 --ep 8 --dp 1"
		"--devices 8 --tp 2 --ep 4 --dp 1"
		"--devices 8 --tp 2 --ep 2 --dp 2"
	)
	common=(examples/moe/model.go --batch 16 --set experts=8)
fi
: >"$OUT/rows.tsv"
for p in "${plans[@]}"; do
	# shellcheck disable=SC2086
	"$OUT/gcompile" "${common[@]}" $p --hardware "$HARDWARE" --plan --plan-top 100 --metrics "$OUT/plan.json" >/dev/null 2>&1
	# shellcheck disable=SC2086
	"$OUT/gcompile" "${common[@]}" $p --run --steps "$STEPS" --metrics "$OUT/run.json" >/dev/null 2>&1
	python3 - "$OUT/plan.json" "$OUT/run.json" "$p" >>"$OUT/rows.tsv" <<'PY'
import json, statistics, sys
plan = json.load(open(sys.argv[1]))["plans"]
flags = sys.argv[3].split()
def flag(name, default):
    return int(flags[flags.index(name) + 1]) if name in flags else default
recompute = flags[flags.index("--recompute") + 1] if "--recompute" in flags else "none"
# The plan the run trains: the search varies every axis the flags leave
# open (sp, offload, ZeRO, microbatches, recompute), so pick the row with
# the run's defaults for those.
want = dict(tp=flag("--tp", 1), pp=flag("--pp", 1), dp=flag("--dp", 1), ep=flag("--ep", 1), zero=flag("--zero", 0),
            microbatches=flag("--microbatches", 1), sequence_parallel="--sequence-parallel" in flags,
            recompute=recompute, offload="")
row = next(r for r in plan if all(r[k] == v for k, v in want.items()))
steps = json.load(open(sys.argv[2]))["steps"][3:]
print("%s\t%.1f\t%.1f" % (sys.argv[3], row["predicted_step_ms"], statistics.median(s["ms"] for s in steps)))
PY
	tail -1 "$OUT/rows.tsv" >&2
done
python3 - "$OUT/rows.tsv" <<'PY'
import sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])]
pred = [float(r[1]) for r in rows]
meas = [float(r[2]) for r in rows]
def ranks(x):
    order = sorted(range(len(x)), key=lambda i: x[i])
    r = [0.0] * len(x)
    for k, i in enumerate(order):
        r[i] = k
    return r
rp, rm = ranks(pred), ranks(meas)
n = len(rows)
rho = 1 - 6 * sum((a - b) ** 2 for a, b in zip(rp, rm)) / (n * (n * n - 1))
print("%-52s %10s %10s %8s" % ("plan", "pred ms", "meas ms", "err %"))
for r, p, m in zip(rows, pred, meas):
    print("%-52s %10.1f %10.1f %+7.1f" % (r[0], p, m, (p - m) / m * 100))
print("mean absolute error %.1f %%, Spearman rank correlation %.2f over %d plans" % (sum(abs(p - m) / m for p, m in zip(pred, meas)) / n * 100, rho, n))
best_pred = min(range(n), key=lambda i: pred[i])
print("fastest predicted: %s (measured %.1f ms); fastest measured: %.1f ms" % (rows[best_pred][0], meas[best_pred], min(meas)))
PY
