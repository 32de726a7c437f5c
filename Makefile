# gcompile: `make demo` compiles the example GPT and trains it on CPU;
# `make test` runs vet and every test. Both work from a fresh clone with
# only Go installed.
GO      ?= go
# pipefail: a failing `go test` is not hidden by the reporter after it.
SHELL   := /bin/bash -o pipefail
OUT     ?= out
export CGO_ENABLED = 0

.PHONY: demo test test-full build vet bench fuzz clean gpu-bundle cost-tables

# bin/gcompile, the command the README's examples call. A first build on a
# fresh machine fetches the modules and compiles everything (15–20 s on 2
# cores); later ones take a second or two.
build:
	@echo "building bin/gcompile (a first build fetches modules and compiles everything: 15–20 s on 2 cores) …"
	$(GO) build -o bin/gcompile ./cmd/gcompile

# The main job: the reference GPT (byte-level, 2 layers, h=128) compiled for
# four virtual CPU devices, tensor parallelism 2 × a 2-stage pipeline (1F1B,
# 4 microbatches), and trained on the Go standard library's sources, with
# pass-by-pass dumps (the stage cut, the sharding, the collectives) and
# metrics in $(OUT)/. It trains exactly as one device would: the same loss
# at every step. DEMO_FLAGS are appended (a later flag wins): make demo
# DEMO_FLAGS="--steps 20".
DEMO_FLAGS ?=
demo: build
	@mkdir -p $(OUT)
	bin/gcompile examples/gpt/model.go --devices 4 --tp 2 --pp 2 --microbatches 4 --run \
		--steps 250 --batch 16 --lr 3e-3 --min-lr 3e-4 --warmup 20 --seed 1 \
		--eval-every 50 --eval-batches 16 \
		--metrics $(OUT)/demo-metrics.json --dump $(OUT)/dump --save $(OUT)/gpt.safetensors $(DEMO_FLAGS)

vet:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || (echo "gofmt needed:"; gofmt -l $$(git ls-files '*.go'); exit 1)
	$(GO) vet ./...

# Plain `go test` hides skipped tests; tools/testreport lists each with its
# reason after the package lines, and prints failed tests' output whole.
# -timeout catches a hang, not slowness: the slowest package takes about 2
# minutes alone on 2 cores, and 15 minutes was reached beside a second
# make test and two spinning cores (tools/flakehunt -burn 2).
test: vet
	$(GO) test -count=1 -timeout 30m -json ./... | $(GO) run ./tools/testreport

# make test covers each feature once; this adds the rest of the matrices
# (more plans across processes, more CUDA cases on the stand-in GPU).
test-full: vet
	GCOMPILE_FULL_TESTS=1 $(GO) test -count=1 -timeout 60m -json ./... | $(GO) run ./tools/testreport

# Benchmarks: compile time of GPT-3 175B shapes, GEMM GFLOP/s, step time.
# Compare runs with benchstat (golang.org/x/perf/cmd/benchstat).
bench:
	$(GO) test -run '^$$' -bench . -benchmem -count 6 ./... | tee $(OUT)/bench.txt

# What a GPU machine without Go is sent, in gpu-bundle/ (git-ignored): run.sh
# and kit.tar.xz (stripped binaries, CUDA test binaries, models as .gir, a
# corpus, the PyTorch yardsticks), 14 MB of the 64 MiB a lent machine takes;
# run.sh unpacks the kit there and runs it all. bench/gpu's test keeps it
# under 60 MiB.
gpu-bundle:
	bash bench/gpu/bundle.sh gpu-bundle

# The cost model against published and measured runs: rewrites the
# generated tables of README.md and docs/architecture.md (which make test
# checks), then prints every row of every source.
cost-tables:
	@mkdir -p $(OUT)
	$(GO) test -count 1 -run TestDocsFiguresAreCurrent ./cost/ -update-docs
	$(GO) test -count 1 -v -run 'TestPublishedRuns|TestMorePublishedRuns|TestPublishedRunsRankAlike|TestCalibrateOnOnePublishedRun|TestVTrain|TestCalibrateFindsTheHostFloor' ./cost/ | tee $(OUT)/cost-tables.txt

# A minute each for the parser of .gir text and the readers of what a
# user hands the cost model (--hardware, --calibrate); make test runs
# their seeds and any crasher kept under testdata/fuzz.
fuzz:
	$(GO) test ./ir -run '^$$' -fuzz FuzzParse -fuzztime 60s
	$(GO) test ./cost -run '^$$' -fuzz FuzzLoadHardware -fuzztime 60s
	$(GO) test ./planner -run '^$$' -fuzz FuzzReadMeasured -fuzztime 60s

clean:
	rm -rf $(OUT)
