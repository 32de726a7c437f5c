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

# Every fuzz target for FUZZTIME each (30 s: about 7 minutes in all):
# the readers of what a user or a peer hands gcompile (.gir text and fused
# bodies, schedules, --hardware, --calibrate, tokenizers, indexed datasets,
# data splits and blends, JSON fields, checkpoints, the rendezvous
# server). make test runs their seeds and any crasher kept under
# testdata/fuzz. The go command fuzzes one target at a time, named by an
# anchored pattern. Go 1.26's fuzzing coordinator can report a bare
# "context deadline exceeded" as the fuzz time runs out, with no input
# to blame (go.dev/issue/75804, fixed in Go 1.27): a run that fails so and
# writes no crasher under testdata/fuzz is reported and not counted.
FUZZTIME ?= 30s
FUZZ_TARGETS = ./ir:FuzzParse ./ir:FuzzParseFusedBody ./passes/schedule:FuzzParse \
	./cost:FuzzLoadHardware ./planner:FuzzReadMeasured \
	./data/tokenizer:FuzzRoundTrip ./data/tokenizer:FuzzLoad ./data/indexed:FuzzParseIndex \
	./data/sample:FuzzParseSplit ./data/sample:FuzzParseBlend ./data/prepare:FuzzJSONField \
	./runtime/checkpoint:FuzzRead ./runtime/dist:FuzzServer
fuzz:
	@mkdir -p $(OUT)
	@failed=0; for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; name=$${t##*:}; dir=$$pkg/testdata/fuzz/$$name; \
		before=$$(ls $$dir 2>/dev/null | wc -l); \
		echo "fuzzing $$name in $$pkg for $(FUZZTIME)"; \
		if $(GO) test $$pkg -run '^$$' -fuzz "^$$name\$$" -fuzztime $(FUZZTIME) > $(OUT)/fuzz.log 2>&1; then \
			tail -n 1 $(OUT)/fuzz.log; \
		elif [ "$$(ls $$dir 2>/dev/null | wc -l)" -eq "$$before" ] && grep -q '^    context deadline exceeded$$' $(OUT)/fuzz.log; then \
			echo "$$name: the coordinator's deadline race (go.dev/issue/75804), no input found"; \
		else \
			cat $(OUT)/fuzz.log; failed=1; \
		fi; \
	done; exit $$failed

clean:
	rm -rf $(OUT)
