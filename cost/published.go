package cost

import "fmt"

// PublishedRun is a measured training run from the literature: a model's
// shape, the parallel configuration the authors ran, and what they
// measured. The cost model is checked against these runs afterwards
// (cost.TestPublishedRuns, planner.TestPlannerBeatsPublished); nothing in
// the model is fitted to them.
type PublishedRun struct {
	Source string // paper and table
	Name   string // the paper's name for the model
	Shape  Transformer
	GPUs   int
	// The authors' configuration. MicroBatch and VPP are the papers' own
	// where they state them; where they do not (Narayanan et al.'s Table 1)
	// they are the choice stated in Assumed, made before comparing.
	TP, PP, VPP, Batch, MicroBatch int
	// CP is the context-parallel degree (0 or 1: none).
	CP               int
	SequenceParallel bool
	Recompute        string // full or selective
	// What was measured: the iteration time in seconds (0 when the paper
	// gives only throughput), the throughput per GPU in TFLOP/s in the
	// paper's FLOPs convention (PaperFLOPs), the model FLOPs utilisation
	// (0 when not given).
	StepSeconds, TFLOPSPerGPU, MFU float64
	// Checked says where the row's figures were confirmed in a source
	// found in the search index; Assumed what had to be chosen.
	Checked, Assumed string
	// Hardware is the preset the run is priced on ("": a100-80g), with
	// the inter-node share per GPU overridden when the cluster's network
	// is not the preset's (InterGBps > 0). Precision "" is fp16.
	Hardware  string
	InterGBps float64
	// HostOpUS, when > 0, is the framework's host time to issue a kernel
	// (Hardware.HostOpUS) for runs whose source measured it.
	HostOpUS  float64
	Precision string
	// Zero is the optimizer sharding (ZeRO-1 for a distributed
	// optimizer); Overlap says the framework overlapped the data-parallel
	// reduction with the backward (Megatron-Core, FSDP), where the 2021
	// papers' local DDP reduced after it, and under ZeRO the gather of
	// the updated weights with the next forward (Plan.OverlapShards);
	// OverlapTP the tensor-parallel communication with the GEMMs
	// (Megatron-Core's --tp-comm-overlap).
	Zero               int
	Overlap, OverlapTP bool
	// FP8Params: the framework keeps its model weights in fp8 and gathers
	// them so (Transformer Engine's fp8 params); otherwise a sharded
	// optimizer gathers 16-bit weights.
	FP8Params bool
	// GradReduceBytes is Plan.GradReduceBytes: 2 where the framework
	// reduced its 16-bit gradients as they were, 0 (fp32) elsewhere.
	GradReduceBytes float64
}

// HardwareFor is the description the run is priced on.
func (r PublishedRun) HardwareFor() (*Hardware, error) {
	name := r.Hardware
	if name == "" {
		name = "a100-80g"
	}
	h, err := Preset(name)
	if err != nil {
		return nil, err
	}
	if r.InterGBps > 0 {
		h.InterGBps = r.InterGBps
	}
	if r.HostOpUS > 0 {
		h.HostOpUS = r.HostOpUS
	}
	return h, nil
}

// narayanan is Narayanan et al. 2021 ("Efficient Large-Scale Language
// Model Training on GPU Clusters Using Megatron-LM"), §5.1: V 51,200, s
// 2048, mixed precision, A100-80GB DGX nodes, "the interleaved pipeline
// schedule with the scatter/gather optimization", activation
// recomputation (their equation 3 counts its extra forward).
func narayanan(name string, heads, hidden, layers, tp, pp, gpus, batch int, tflops float64) PublishedRun {
	r := PublishedRun{Source: "Narayanan et al. 2021, Table 1", Name: name,
		Shape: Transformer{Layers: layers, Hidden: hidden, Heads: heads, Seq: 2048, Vocab: 51200, FFN: 4 * hidden},
		GPUs:  gpus, TP: tp, PP: pp, VPP: 1, Batch: batch, MicroBatch: 1, Recompute: "full", TFLOPSPerGPU: tflops,
		Checked: "the paper's text of §5.1 and Table 1 (a markdown copy of arXiv:2104.04473 in the index; " +
			"find_string \"| 3072 | 30 | 2 | 1 | 64\" also returns three independent notes with the same ten rows)",
		Assumed: "microbatch 1; the interleaved schedule with 2 chunks per rank where the layers per stage are even, else 1F1B (the paper states neither)"}
	// The paper interleaves but does not give v; 2 is the smallest
	// interleaving, used where each stage's layers split in two and the
	// microbatches per replica are a multiple of pp (interleaving's rule).
	dp := gpus / (tp * pp)
	if pp > 1 && (layers/pp)%2 == 0 && (batch/dp)%pp == 0 {
		r.VPP = 2
	}
	return r
}

// korthikanti is Korthikanti et al. 2022 ("Reducing Activation
// Recomputation in Large Transformer Models"), Tables 3 and 5: A100-80GB,
// s 2048, V 51,200, no data parallelism, the interleaved schedule with 3
// chunks per rank for 175B and 530B. The baseline recomputes every layer
// (tensor parallelism alone); "present work" is sequence parallelism with
// selective recomputation. MFU is given for the latter (and is the
// Megatron-LM README's table).
func korthikanti(name string, heads, hidden, layers, tp, pp, vpp, gpus, batch, micro int, full, present, mfu float64) []PublishedRun {
	shape := Transformer{Layers: layers, Hidden: hidden, Heads: heads, Seq: 2048, Vocab: 51200, FFN: 4 * hidden}
	const checked = "a reading note on arXiv:2205.05198 in the index (find_string \"20480 | 105 | 8 | 35 | 280\"), its Tables 3 and 5; " +
		"the MFU column also in the Megatron-LM README's table (find_string \"| 22B | 41.5% | 43.7% |\")"
	base := PublishedRun{Source: "Korthikanti et al. 2022, Tables 3 and 5", Shape: shape, GPUs: gpus, TP: tp, PP: pp, VPP: vpp,
		Batch: batch, MicroBatch: micro, Checked: checked}
	a, b := base, base
	a.Name, a.Recompute, a.StepSeconds = name+" full recompute", "full", full
	b.Name, b.Recompute, b.SequenceParallel, b.StepSeconds, b.MFU = name+" sp+selective", "selective", true, present, mfu
	return []PublishedRun{a, b}
}

// PublishedRuns are the runs the model is checked against, in the papers'
// row order.
func PublishedRuns() []PublishedRun {
	runs := []PublishedRun{
		narayanan("1.7B", 24, 2304, 24, 1, 1, 32, 512, 137),
		narayanan("3.6B", 32, 3072, 30, 2, 1, 64, 512, 138),
		narayanan("7.5B", 32, 4096, 36, 4, 1, 128, 512, 142),
		narayanan("18.4B", 48, 6144, 40, 8, 1, 256, 1024, 135),
		narayanan("39.1B", 64, 8192, 48, 8, 2, 512, 1536, 138),
		narayanan("76.1B", 80, 10240, 60, 8, 4, 1024, 1792, 140),
		narayanan("145.6B", 96, 12288, 80, 8, 8, 1536, 2304, 148),
		narayanan("310.1B", 128, 16384, 96, 8, 16, 1920, 2160, 155),
		narayanan("529.6B", 128, 20480, 105, 8, 35, 2520, 2520, 163),
		narayanan("1008B", 160, 25600, 128, 8, 64, 3072, 3072, 163),
	}
	runs = append(runs, korthikanti("22B", 64, 6144, 48, 8, 1, 1, 8, 4, 4, 1.42, 1.10, 0.415)...)
	runs = append(runs, korthikanti("175B", 96, 12288, 96, 8, 8, 3, 64, 64, 1, 18.13, 13.75, 0.514)...)
	runs = append(runs, korthikanti("530B", 128, 20480, 105, 8, 35, 3, 280, 280, 1, 49.05, 37.83, 0.560)...)
	runs = append(runs, korthikanti("1T", 160, 25600, 128, 8, 64, 1, 512, 512, 1, 94.42, 71.49, 0.563)...)
	return runs
}

// Plan is the run's configuration as a cost.Plan (fp16 mixed precision,
// Adam, and unless r.Overlap the gradients reduced after the backward in
// one collective: Megatron-LM's local DDP of those papers reduced one
// flat buffer).
func (r PublishedRun) Plan() Plan {
	cp := max(r.CP, 1)
	dp := r.GPUs / (r.TP * r.PP * cp)
	prec := r.Precision
	if prec == "" {
		prec = "fp16"
	}
	p := Plan{TP: r.TP, PP: r.PP, DP: dp, CP: cp, VPP: r.VPP, MicroBatch: r.MicroBatch,
		Microbatches: r.Batch / (dp * r.MicroBatch), SequenceParallel: r.SequenceParallel,
		Recompute: r.Recompute, Precision: prec, Optimizer: "adamw", SerialReductions: !r.Overlap, Zero: r.Zero,
		OverlapTP: r.OverlapTP, OverlapShards: r.Overlap && r.Zero >= 1, GatherBytes: 2, ReduceOnce: true, GradReduceBytes: r.GradReduceBytes}
	if r.FP8Params {
		p.GatherBytes = 1
	}
	if !r.Overlap {
		p.BucketBytes = 1 << 50
	}
	if r.PP > 1 {
		p.Schedule = "1f1b"
		if r.VPP > 1 {
			p.Schedule = "interleaved"
		}
	}
	return p
}

// PaperFLOPs is one step's work as Narayanan et al. count it (their
// equation 3: the GEMMs of forward, backward and a recomputed forward,
// 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h))), the numerator of the published
// TFLOP/s per GPU whatever the run recomputes.
func (r PublishedRun) PaperFLOPs() float64 {
	B, s, l, h, V := float64(r.Batch), float64(r.Shape.Seq), float64(r.Shape.Layers), float64(r.Shape.Hidden), float64(r.Shape.Vocab)
	return 96 * B * s * l * h * h * (1 + s/(6*h) + V/(16*l*h))
}

// PublishedStep is the measured iteration time: given, or derived from
// the published throughput and PaperFLOPs.
func (r PublishedRun) PublishedStep() float64 {
	switch {
	case r.StepSeconds > 0:
		return r.StepSeconds
	case r.TFLOPSPerGPU > 0:
		return r.PaperFLOPs() / (float64(r.GPUs) * r.TFLOPSPerGPU * 1e12)
	}
	// From the model FLOPs utilisation: the model's FLOPs (no recompute,
	// full attention, as PaLM's MFU counts them) over the dense peak of
	// the run's precision.
	h, err := r.HardwareFor()
	if err != nil || !(r.MFU > 0) {
		return 0
	}
	return r.Shape.ModelFLOPs(r.Batch) / (float64(r.GPUs) * r.MFU * h.Peak(r.Plan().DTypeName()))
}

// MorePublishedRuns are published runs beyond Megatron-LM's 2021–2022
// papers: other frameworks, networks and GPUs, each row with its source
// and what had to be assumed. They are checked the same way
// (cost.TestMorePublishedRuns), each on its own hardware, nothing fitted.
func MorePublishedRuns() []PublishedRun {
	var runs []PublishedRun
	bloom := PublishedRun{Source: "BLOOM-176B (BigScience tr11-176B-ml)", Name: "BLOOM-176B",
		Shape: Transformer{Layers: 72, Hidden: 14336, Heads: 112, Seq: 2048, Vocab: 250880, FFN: 4 * 14336},
		GPUs:  384, TP: 4, PP: 12, VPP: 1, Batch: 2048, MicroBatch: 2, Recompute: "full", Precision: "bf16", Zero: 1,
		StepSeconds: 104.70, InterGBps: 4 * 12.5 / 8,
		Checked: "bigscience-workshop/bigscience train/tr11-176B-ml/README.md (Architecture, Replica setup, Hardware, " +
			"Important checkpoints: \"elapsed time per iteration (s): 104.70 … TFLOPs: 149.77\" at GBS 2048) and tr11-176B-ml.slurm " +
			"(NLAYERS 70, NHIDDEN 14336, NHEADS 112, TP 4, PP 12, MICRO_BATCH_SIZE 2, --pad-vocab-size-to 250880, --bf16, " +
			"activation checkpointing); no sequence parallelism (the Hugging Face blog on BLOOM's training)",
		Assumed: "the 70 layers priced as 72, 6 a stage (the run put 6 on every stage but the first and last, which held 5 and an embedding: the busiest stages are priced); " +
			"Jean Zay's 4 Omni-Path links per 8-GPU node at 100 Gb/s each (the README names 4 links, not their rate), " +
			"so 6.25 GB/s of network per GPU; DeepSpeed's pipeline priced as 1F1B; the attention core not fused (softmax through memory)"}
	runs = append(runs, bloom)
	for _, r := range []struct {
		nodes int
		step  float64
	}{{280, 60.1}, {350, 50.2}, {420, 44.4}} {
		runs = append(runs, PublishedRun{Source: "Smith et al. 2022 (MT-NLG 530B), §2.4", Name: fmt.Sprintf("MT-NLG 530B ×%d", r.nodes),
			Shape: Transformer{Layers: 105, Hidden: 20480, Heads: 128, Seq: 2048, Vocab: 51200, FFN: 4 * 20480},
			GPUs:  8 * r.nodes, TP: 8, PP: 35, VPP: 1, Batch: 1920, MicroBatch: 1, Recompute: "full", Precision: "bf16", Zero: 1,
			StepSeconds: r.step,
			Checked: "arXiv:2201.11990 §2.4 and §3.2 as quoted by cli99/llm-analysis examples/megatron-turing-nlg and other notes " +
				"(105 layers, h 20480, 128 heads, s 2048, batch 1920, tp 8, pp 35; iterations of 60.1, 50.2 and 44.4 s on 280, 350 and 420 DGX A100 nodes)",
			Assumed: "microbatch 1, full recompute (the published 126/121/113 TFLOP/s follow Narayanan's equation 3, which counts it), " +
				"1F1B, vocabulary 51,200, ZeRO-1; the paper's own text was not read"})
	}
	for _, r := range []struct {
		gpus, dp, perDP int
		mfu             float64
	}{{8192, 64, 32, 0.43}, {16384, 128, 16, 0.41}} {
		runs = append(runs, PublishedRun{Source: "Llama 3 405B (Llama Team 2024), Table 4", Name: fmt.Sprintf("Llama 3 405B ×%d", r.gpus),
			Shape: Transformer{Layers: 128, Hidden: 16384, Heads: 128, KVHeads: 8, Seq: 8192, Vocab: 128256, FFN: 53248,
				GatedMLP: true, FusedAttention: true},
			GPUs: r.gpus, TP: 8, PP: 16, VPP: 4, Batch: r.dp * r.perDP, MicroBatch: 1, SequenceParallel: true, Recompute: "none",
			Precision: "bf16", Zero: 2, Overlap: true, MFU: r.mfu, Hardware: "h100-sxm",
			Checked: "arXiv:2407.21783 Table 3 (126 layers, h 16384, 128 heads, 8 k/v heads, FFN 53248, SwiGLU) and Table 4 " +
				"(tp 8, cp 1, pp 16, dp 64 or 128, s 8192, 32 or 16 sequences per dp group, BF16 MFU 43 % and 41 %); §3.3.2: no activation " +
				"checkpointing at 8K, FSDP sharding optimizer states and gradients",
			Assumed: "the 126 layers priced as 128 (the estimate needs pp·vpp to divide them; the paper takes one layer off the first and last stages), " +
				"4 chunks per rank, microbatch 1, sequence parallelism, the dp reduction overlapped; vocabulary 128,256"})
	}
	for _, r := range []struct {
		name                          string
		heads, hidden, layers, tp, pp int
		gpus, batch                   int
		mfu                           float64
	}{
		{"1.7B", 16, 2048, 24, 1, 1, 48, 192, 0.41},
		{"7.1B", 32, 4096, 30, 2, 1, 96, 192, 0.47},
		{"16B", 48, 6144, 32, 4, 1, 192, 192, 0.49},
		{"32B", 56, 7168, 48, 8, 1, 384, 192, 0.46},
		{"70B", 64, 8192, 84, 8, 2, 768, 384, 0.42},
		{"119B", 80, 10240, 92, 8, 4, 1536, 768, 0.43},
		{"177B", 96, 12288, 96, 8, 6, 2304, 1152, 0.44},
		{"314B", 128, 16384, 96, 8, 8, 3072, 1536, 0.48},
		{"462B", 144, 18432, 112, 8, 16, 6144, 3072, 0.47},
	} {
		runs = append(runs, PublishedRun{Source: "Megatron-LM README, H100 table (Megatron-Core r0.8.0)", Name: "MCore " + r.name,
			Shape: Transformer{Layers: r.layers, Hidden: r.hidden, Heads: r.heads, Seq: 4096, Vocab: 131072, FFN: 4 * r.hidden, FusedAttention: true},
			GPUs:  r.gpus, TP: r.tp, PP: r.pp, VPP: 1, Batch: r.batch, MicroBatch: 1, SequenceParallel: r.tp > 1, Recompute: "none",
			Precision: "bf16", Zero: 1, Overlap: true, OverlapTP: r.tp > 1, MFU: r.mfu, Hardware: "h100-sxm",
			Checked: "NVIDIA/Megatron-LM README since commit f2e5db40 (\"New scaling figures on H100 GPUs\"): heads, h, layers, tp, pp, dp 48, GPUs, " +
				"batch, MFU; vocabulary 131,072 and s 4096 for all; overlapped dp, tp and pp communication",
			Assumed: "microbatch 1, 1F1B without interleaving, sequence parallelism with tp, no recompute, bf16, FFN 4h, the distributed optimizer (ZeRO-1)"})
	}
	runs = append(runs, mlperfGPT3Hopper()...)
	// Megatron-Bridge's performance summary, NeMo 25.11 container,
	// DGX-H100, FP8 with current scaling: tokens/s/GPU, so the step is
	// batch·s over that times the GPUs.
	for _, r := range []struct {
		name                                 string
		layers, hidden, heads, ffn           int
		gpus, batch, tp, pp, cp, vpp, tokens int
	}{
		{"Llama 3 70B", 80, 8192, 64, 28672, 64, 128, 4, 8, 1, 5, 1602},
		{"Llama 3.1 405B", 128, 16384, 128, 53248, 1024, 512, 8, 8, 2, 8, 292},
	} {
		runs = append(runs, PublishedRun{Source: "Megatron-Bridge performance summary, NeMo 25.11, DGX-H100 (FP8)", Name: fmt.Sprintf("%s ×%d", r.name, r.gpus),
			Shape: Transformer{Layers: r.layers, Hidden: r.hidden, Heads: r.heads, KVHeads: 8, Seq: 8192, Vocab: 128256, FFN: r.ffn,
				GatedMLP: true, FusedAttention: true},
			GPUs: r.gpus, TP: r.tp, PP: r.pp, CP: r.cp, VPP: r.vpp, Batch: r.batch, MicroBatch: 1, SequenceParallel: true, Recompute: "none",
			Precision: "fp8", Zero: 1, Overlap: true, OverlapTP: true, Hardware: "h100-sxm",
			StepSeconds: float64(r.batch*8192) / float64(r.tokens*r.gpus),
			Checked: "NVIDIA-NeMo/Megatron-Bridge docs/performance-summary.md, 25.11, DGX-H100 rows (GPUs, FP8-CS, GBS, MBS 1, s 8192, FSDP 0, tp, pp, cp, vp, " +
				"tokens/s/GPU) and scripts/performance/configs/llama/llama3_workload_base_configs.py (the 70B H100 FP8-CS preset: tp 4, pp 8, vp 5, no recompute)",
			Assumed: "the 405B's 126 layers priced as 128 (pp·vp must divide them), the distributed optimizer (ZeRO-1) with its reductions overlapped, " +
				"tp communication overlapped, the ring for cp; Llama 3 shapes from its paper (8 k/v heads, SwiGLU, vocabulary 128,256)"})
	}
	runs = append(runs, mlperfV51()...)
	runs = append(runs, mlperfLlama405H100()...)
	// NeMo's performance summary, 24.07 container, DGX-H100, FP8: the
	// models' shapes are confirmed by the table itself (its model TFLOP/s
	// over its tokens/s is each shape's FLOPs a token within 0.2 %,
	// TestNeMoShapesMatchTheirFLOPs).
	return append(runs, nemo2407H100()...)
}

// nemoRow is a row of NeMo's performance summary: the model, its run
// and the throughput it reached.
type nemoRow struct {
	name                             string
	shape                            Transformer
	gpus, batch, mbs, tp, pp, cp, vp int
	tokens, tflops                   float64 // per GPU a second
}

// padVocab is the vocabulary v as Megatron pads it under tensor
// parallelism tp: up to a multiple of 128·tp.
func padVocab(v, tp int) int { return (v + 128*tp - 1) / (128 * tp) * 128 * tp }

// nemo2407H100Rows is NeMo 24.07's pre-training table on DGX-H100 in
// FP8, the vocabularies padded (padVocab).
func nemo2407H100Rows() []nemoRow {
	gpt := func(l, h, heads, tp int) Transformer {
		return Transformer{Layers: l, Hidden: h, Heads: heads, Seq: 2048, Vocab: padVocab(50257, tp), FFN: 4 * h, FusedAttention: true}
	}
	llama := func(l, h, heads, kv, ffn, seq, vocab, tp int) Transformer {
		return Transformer{Layers: l, Hidden: h, Heads: heads, KVHeads: kv, Seq: seq, Vocab: padVocab(vocab, tp), FFN: ffn, GatedMLP: true, FusedAttention: true}
	}
	nemotron := func(l, h, heads, kv, tp int) Transformer {
		return Transformer{Layers: l, Hidden: h, Heads: heads, KVHeads: kv, Seq: 4096, Vocab: padVocab(256000, tp), FFN: 4 * h, FusedAttention: true}
	}
	return []nemoRow{
		{"GPT3-5B", gpt(24, 4096, 32, 1), 64, 2048, 4, 1, 1, 1, 1, 22521, 736},
		{"GPT3-20B", gpt(44, 6144, 48, 2), 64, 256, 2, 2, 1, 1, 1, 5851, 750},
		{"GPT3-175B", gpt(96, 12288, 96, 4), 128, 256, 1, 4, 8, 1, 6, 726, 782},
		{"GPT3-175B", gpt(96, 12288, 96, 4), 512, 2048, 2, 4, 8, 1, 6, 782, 842},
		{"Llama 2 7B", llama(32, 4096, 32, 0, 11008, 4096, 32000, 1), 8, 128, 1, 1, 1, 1, 1, 16847, 776},
		{"Llama 2 13B", llama(40, 5120, 40, 0, 13824, 4096, 32000, 1), 16, 128, 1, 1, 4, 1, 10, 8646, 754},
		{"Llama 2 70B", llama(80, 8192, 64, 8, 28672, 4096, 32000, 4), 64, 128, 1, 4, 4, 1, 20, 1707, 759},
		{"Nemotron 8B", nemotron(32, 4096, 32, 0, 2), 64, 256, 4, 2, 1, 1, 1, 12701, 653},
		{"Nemotron 22B", nemotron(40, 6144, 48, 0, 2), 64, 256, 2, 2, 4, 1, 10, 4256, 554},
		{"Nemotron 340B", nemotron(96, 18432, 96, 8, 8), 128, 32, 1, 8, 8, 1, 12, 322, 678},
		{"Llama 3 8B", llama(32, 4096, 32, 8, 14336, 8192, 128256, 1), 8, 128, 1, 1, 1, 2, 1, 12036, 697},
		{"Llama 3 70B", llama(80, 8192, 64, 8, 28672, 8192, 128256, 4), 64, 128, 1, 4, 4, 2, 5, 1533, 738},
	}
}

// nemo2407H100 is nemo2407H100Rows as published runs: the step is the
// batch's tokens over the tokens a second of all the GPUs.
func nemo2407H100() []PublishedRun {
	var runs []PublishedRun
	for _, r := range nemo2407H100Rows() {
		runs = append(runs, PublishedRun{Source: "NeMo performance summary, NeMo 24.07, DGX-H100 (FP8)", Name: fmt.Sprintf("%s ×%d", r.name, r.gpus),
			Shape: r.shape, GPUs: r.gpus, TP: r.tp, PP: r.pp, CP: r.cp, VPP: r.vp, Batch: r.batch, MicroBatch: r.mbs,
			SequenceParallel: r.tp > 1, Recompute: "none", Precision: "fp8", Zero: 1, Overlap: true, OverlapTP: r.tp > 1, Hardware: "h100-sxm",
			StepSeconds: float64(r.batch*r.shape.Seq) / (r.tokens * float64(r.gpus)),
			Checked: "NVIDIA/NeMo docs/source/performance/performance_summary.md, pre-training at FP8, container NeMo 24.07, System DGX-H100 " +
				"(GPUs, GBS, MBS, sequence, tp, pp, cp, vp, tokens/s/GPU, model TFLOP/s/GPU)",
			Assumed: "no activation recompute, sequence parallelism and tp communication overlap wherever tp > 1, the distributed optimizer " +
				"(ZeRO-1) with its reductions overlapped, the ring for cp, fused attention; shapes from the models' published configurations " +
				"(GPT-3's 4h MLP and learned positions, Llama's SwiGLU, Nemotron's squared-ReLU MLP of 4h and 8 k/v heads at 340B), " +
				"the output layer priced as tied (it is untied in Llama and Nemotron: its weights' memory, not its FLOPs, is short)"})
	}
	return runs
}

// mlperfGPT3 is GPT-3 175B as MLPerf Training trains it: the vocabulary
// padded to a multiple of 128·tp at tp 4, Transformer Engine's fused
// attention.
func mlperfGPT3() Transformer {
	return Transformer{Layers: 96, Hidden: 12288, Heads: 96, Seq: 2048, Vocab: 50688, FFN: 4 * 12288, FusedAttention: true}
}

// mlperfLlama405 is Llama 3.1 405B as MLPerf Training trains it at
// tensor parallelism tp: NeMo's Llama31Config405B (h 16384, 128 heads, 8
// k/v heads, FFN 53248) with the benchmark's vocabulary of 32,000 padded
// (padVocab; 32,256 at tp 4 as Nebius's log prints it), and its 126
// layers priced as 128: the configs' ASYM_PP_EMBED and ASYM_PP_LOSS give
// the embedding and the loss a pipeline slot each, 128 in all over
// pp·vpp = 64 chunks.
func mlperfLlama405(tp int) Transformer {
	return Transformer{Layers: 128, Hidden: 16384, Heads: 128, KVHeads: 8, Seq: 8192, Vocab: padVocab(32000, tp), FFN: 53248, GatedMLP: true, FusedAttention: true}
}

// mlperfV51 is MLPerf Training v5.1's pre-training runs on Hopper whose
// configuration and step times are both in the results repository: on
// H200 (8 GPUs a node, 8 NDR 400 Gb/s links: the h200 preset) HPE's
// Llama 3.1 8B and Nebius's 405B, and Cisco's 8B on H100; NeMo with
// Megatron-Core in FP8, each step the median of every train_step_time its
// logs print. All run the distributed optimizer with the gradients'
// reduce-scatter and the weights' fp8 all-gather overlapped, and the
// ring for cp (cp_comm_type p2p).
func mlperfV51() []PublishedRun {
	const repo = "mlcommons/training_results_v5.1 "
	// Llama 3.1 8B as the log prints it (num_layers 32, hidden_size 4096,
	// 32 heads, num_query_groups 8, ffn_hidden_size 14336, seq 8192,
	// padded vocab_size 128256, share_embeddings_and_output_weights False).
	l8 := Transformer{Layers: 32, Hidden: 4096, Heads: 32, KVHeads: 8, Seq: 8192, Vocab: 128256, FFN: 14336, GatedMLP: true, FusedAttention: true}
	runs := []PublishedRun{{Source: "MLPerf Training v5.1, HPE Cray XD670 (H200), Llama 3.1 8B (FP8)", Name: "Llama 3.1 8B ×64",
		Shape: l8, GPUs: 64, TP: 1, PP: 1, CP: 2, VPP: 1, Batch: 32, MicroBatch: 1, Recompute: "none",
		Precision: "fp8", Zero: 1, Overlap: true, FP8Params: true, Hardware: "h200", StepSeconds: 0.3531,
		Checked: repo + "HPE/systems/HPE-Cray-XD670-H200-SXM5-141GB_n8_25.09.json (8 nodes of 8 H200-SXM5-141GB, 8 InfiniBand NDR 400 Gb/s adapters a node) and " +
			"HPE/benchmarks/llama3_8b/implementations/nemo-x86_64/config_XD670_8x8x1xtp1pp1cp2_8b.sh with the config_common*.sh it sources " +
			"(tp 1, pp 1, cp 2, microbatch 1, FP8 hybrid, USE_DIST_OPTIMIZER, OVERLAP_GRAD_REDUCE, OVERLAP_PARAM_GATHER, FP8_PARAM_GATHER, " +
			"full-iteration CUDA graphs; MODEL_TFLOP_PER_SAMPLE 421.59); HPE/results/…/llama31_8b/result_1..10.txt (global_batch_size 32, " +
			"gradient_accumulation_steps 1, recompute_granularity None; train_step_time medians 0.3529–0.3533 s over the ten runs)",
		Assumed: "the reduce-scatter in fp32; the attention core in bf16 (the log's fp8_dot_product_attention=False over the config's FP8_DPA)"}}
	// Cisco's Llama 3.1 8B on H100 (the h100-sxm preset: its 8 ConnectX-7
	// 400 Gb/s links a node are an Ethernet fabric), one sequence a data
	// rank, no CUDA graphs.
	for _, r := range []struct {
		nodes, tp int
		step      float64
	}{{8, 1, 0.7205}, {16, 2, 0.4851}} {
		gpus := r.nodes * 8
		runs = append(runs, PublishedRun{Source: "MLPerf Training v5.1, Cisco (H100), Llama 3.1 8B (FP8)", Name: fmt.Sprintf("Llama 3.1 8B ×%d", gpus),
			Shape: l8, GPUs: gpus, TP: r.tp, PP: 1, VPP: 1, Batch: 64, MicroBatch: 1, SequenceParallel: r.tp > 1, Recompute: "none",
			Precision: "fp8", Zero: 1, Overlap: true, OverlapTP: r.tp > 1, FP8Params: true, Hardware: "h100-sxm", StepSeconds: r.step,
			Checked: repo + fmt.Sprintf("Cisco/systems/hpf_n%d.json (%d nodes of 8 H100-SXM5-80GB, 8 ConnectX-7 400 Gb/s compute links a node, Ethernet fabric), ", r.nodes, r.nodes) +
				fmt.Sprintf("Cisco/benchmarks/llama31_8b/implementations/nemo/config_DGXH100_%dx8x1xtp%dpp1cp1.sh, its config_common.sh and conf/custom.yaml ", r.nodes, r.tp) +
				"(microbatch 1, TP_COMM_OVERLAP, sequence_parallel default True, FP8, FP8_PARAMS, USE_DIST_OPTIMIZER, OVERLAP_GRAD_REDUCE, OVERLAP_PARAM_GATHER, " +
				fmt.Sprintf("MCORE_CUDA_GRAPH False, s 8192) and Cisco/results/hpf_n%d/llama31_8b/result_0..9.txt (global_batch_size 64, ", r.nodes) +
				"gradient_accumulation_steps 1; train_step_time medians over the ten runs)",
			Assumed: "the shape of HPE's log (Cisco's logs print no model configuration); the reduce-scatter in fp32"})
	}
	for _, r := range []struct {
		nodes, perDP int
		step         float64
	}{{64, 144, 50.01}, {128, 72, 25.36}} {
		gpus := r.nodes * 8
		runs = append(runs, PublishedRun{Source: "MLPerf Training v5.1, Nebius (H200), Llama 3.1 405B (FP8)", Name: fmt.Sprintf("Llama 3.1 405B ×%d", gpus),
			Shape: mlperfLlama405(4), GPUs: gpus, TP: 4, PP: 8, CP: 2, VPP: 8, Batch: 1152, MicroBatch: 1, SequenceParallel: true, Recompute: "none",
			Precision: "fp8", Zero: 1, Overlap: true, OverlapTP: true, FP8Params: true, Hardware: "h200", StepSeconds: r.step,
			Checked: repo + fmt.Sprintf("Nebius/systems/nebius_h200_n%d.json (H200-SXM5-141GB, 8x ConnectX-7 NDR 400 Gb/s a node), ", r.nodes) +
				fmt.Sprintf("Nebius/benchmarks/llama31_405b/implementations/nebius_h200_n%d/config_DGXH200_%dx8x%dxtp4pp8cp2.sh and its config_common.sh ", r.nodes, r.nodes, r.perDP) +
				"(tp 4, pp 8, interleaving 8, cp 2, microbatch 1, TP_COMM_OVERLAP, FP8, FP8_PARAMS, USE_DIST_OPTIMIZER, OVERLAP_GRAD_REDUCE, " +
				fmt.Sprintf("OVERLAP_PARAM_GATHER) and Nebius/results/nebius_h200_n%d/llama31_405b/result_1..3.txt (global_batch_size 1152, ", r.nodes) +
				"sequence_parallel true, fp8_recipe delayed, no activation checkpointing, num_layers 126, vocab 32,000 padded to 32,256; " +
				"train_step_time medians over the three runs)",
			Assumed: "126 layers priced as 128 (see mlperfLlama405); the reduce-scatter in fp32"})
	}
	return runs
}

// mlperfGPT3Hopper is every submission of GPT-3 175B to MLPerf Training
// v3.0–v4.1 on H100 nodes of 8 GPUs whose logs print each step's
// train_step_timing (the step counter advances by batch × 2048 tokens):
// the median over every value of the submission's result files. All run
// NeMo's GPT-3 recipe: tp 4 · pp 8 with interleaving, sequence
// parallelism, tp communication overlapped, FP8 (hybrid), no recompute,
// and the distributed optimizer overlapping the gradient and parameter
// syncs; from v4.0 on the weights are fp8 (FP8_PARAMS) and gathered so.
// Each submitter's cluster is a source of its own (the runs a
// calibration on one of them may predict).
func mlperfGPT3Hopper() []PublishedRun {
	type sub struct {
		source, repo, results, configs, network string
		fp8Params                               bool
	}
	eos31 := sub{"MLPerf Training v3.1, NVIDIA Eos, GPT-3 175B (FP8)", "mlcommons/training_results_v3.1", "NVIDIA/results/",
		"NVIDIA/benchmarks/gpt3/implementations/pytorch/config_DGXH100_*_mbs1.sh with config_common.sh, config_fp8.sh and conf/custom.yaml",
		"DGX H100, 8 ConnectX-7 400 Gb/s a node", false}
	nv30 := sub{"MLPerf Training v3.0, NVIDIA (DGX H100), GPT-3 175B (FP8)", "mlcommons/training_results_v3.0", "NVIDIA/results/",
		"NVIDIA/benchmarks/gpt3/implementations/pytorch/config_DGXH100_*_mbs1.sh with config_common.sh, config_fp8.sh and config_tp_h100.sh",
		"DGX H100", false}
	cw30 := sub{"MLPerf Training v3.0, CoreWeave (HGX H100), GPT-3 175B (FP8)", "mlcommons/training_results_v3.0", "NVIDIA_CoreWeave/results/",
		"NVIDIA_CoreWeave/benchmarks/gpt3/implementations/pytorch/config_DGXH100_*_mbs1.sh (NVIDIA's v3.0 recipe)",
		"8 ConnectX-7 NDR 400 Gb/s a node", false}
	az31 := sub{"MLPerf Training v3.1, Azure ND H100 v5, GPT-3 175B (FP8)", "mlcommons/training_results_v3.1", "Azure+NVIDIA/results/",
		"Azure+NVIDIA/benchmarks/gpt3/implementations/pytorch/config_DGXH100_1344x8x8x4x8_mbs1.sh (NVIDIA's v3.1 recipe)",
		"8 Quantum-2 ConnectX-7 InfiniBand 400 Gb/s a node", false}
	smc40 := sub{"MLPerf Training v4.0, Sustainable Metal Cloud (H100), GPT-3 175B (FP8)", "mlcommons/training_results_v4.0", "smc/results/",
		"smc/benchmarks/gpt3/implementations/nemo/config_SMCH100_64x8x128x4x8.sh and the configuration its logs print",
		"InfiniBand NDR", true}
	or41 := sub{"MLPerf Training v4.1, Oracle (H100), GPT-3 175B (FP8)", "mlcommons/training_results_v4.1", "Oracle/results/",
		"Oracle/benchmarks/gpt3/DGXH100_128x8x64x4x8_mbs2/config_DGXH100_{192,384}x8x*_mbs2.sh and the configuration its logs print",
		"RoCE v2 Ethernet, BM.GPU.H100.8 nodes", true}
	eos41 := sub{"MLPerf Training v4.1, NVIDIA Eos, GPT-3 175B (FP8)", "mlcommons/training_results_v4.1", "NVIDIA/results/",
		"NVIDIA/benchmarks/gpt3/implementations/eos_n{32,64}_ngc24.09_nemo/config_DGXH100_*_mbs2.sh with config_common.sh and config_fp8.sh",
		"DGX H100", true}
	gpt3 := mlperfGPT3()
	var runs []PublishedRun
	for _, r := range []struct {
		sub
		system              string
		gpus, batch, vp, mb int
		step                float64
	}{
		{nv30, "dgxh100_n64_nemo", 512, 2048, 12, 1, 12.077},
		{nv30, "dgxh100_n96_nemo", 768, 3072, 12, 1, 12.126},
		{cw30, "coreweave_hgxh100_n96_ngc23.04_pytorch", 768, 3072, 12, 1, 12.299},
		{cw30, "coreweave_hgxh100_n192_ngc23.04_pytorch", 1536, 3072, 12, 1, 6.338},
		{cw30, "coreweave_hgxh100_n448_ngc23.04_pytorch", 3584, 2688, 12, 1, 2.598},
		{eos31, "eos_n64_ngc23.09_nemo", 512, 2048, 12, 1, 11.050},
		{eos31, "eos_n96_ngc23.09_nemo", 768, 3072, 12, 1, 11.075},
		{eos31, "eos-dfw_n512_ngc23.09_nemo", 4096, 2048, 12, 1, 1.608},
		{eos31, "eos-dfw_n768_ngc23.09_nemo", 6144, 3072, 12, 1, 1.615},
		{eos31, "eos-dfw_n1024_ngc23.09_nemo", 8192, 4096, 12, 1, 1.619},
		{eos31, "eos-dfw_n1280_ngc23.09_nemo", 10240, 2560, 12, 1, 0.926},
		{eos31, "eos-dfw_n1344_ngc23.09_nemo", 10752, 2688, 12, 1, 0.930},
		{az31, "ND_H100_v5_n1344_pytorch", 10752, 2688, 12, 1, 0.947},
		{smc40, "64xSMC-H100-SXM-80GB", 512, 2048, 12, 2, 10.636},
		{or41, "1536xBM.GPU.H100.8", 1536, 3072, 4, 2, 5.167},
		{or41, "3072xBM.GPU.H100.8", 3072, 3072, 4, 2, 3.064},
		{eos41, "eos_n32_ngc24.09_nemo", 256, 2048, 6, 2, 18.378},
		{eos41, "eos_n64_ngc24.09_nemo", 512, 2048, 6, 2, 9.500},
	} {
		runs = append(runs, PublishedRun{Source: r.source, Name: fmt.Sprintf("GPT-3 175B ×%d", r.gpus),
			Shape: gpt3, GPUs: r.gpus, TP: 4, PP: 8, VPP: r.vp, Batch: r.batch, MicroBatch: r.mb, SequenceParallel: true, Recompute: "none",
			Precision: "fp8", Zero: 1, Overlap: true, OverlapTP: true, FP8Params: r.fp8Params, Hardware: "h100-sxm", StepSeconds: r.step,
			Checked: r.repo + " " + r.results + r.system + "/gpt3/result_*.txt (global_batch_size, gradient_accumulation_steps and every " +
				"train_step_timing; the median) and " + r.configs + " (tp 4, pp 8, interleaving, microbatch, TP_COMM_OVERLAP, FP8 hybrid, " +
				"sequence parallel, no recompute, the distributed optimizer with overlapped gradient and parameter syncs); " + r.network,
			Assumed: "the vocabulary 50,257 padded to 50,688 (a multiple of 128·tp); Transformer Engine's fused attention; " +
				"the distributed optimizer priced as ZeRO-1, its reduce-scatter in fp32"})
	}
	return runs
}

// mlperfLlama405H100 is NVIDIA's Llama 3.1 405B submissions to MLPerf
// Training v5.0 on Eos (DGX H100): tp 8 · pp 8 · vp 8 · cp 2, microbatch
// 1, sequence 8,192, FP8 (e4m3, delayed scaling, fp8 weights), tp
// communication overlapped, the distributed optimizer's syncs
// overlapped, no CUDA graphs and no recompute (mlperfLlama405's shape at
// tp 8). The step is the median train_step_time of the result files.
func mlperfLlama405H100() []PublishedRun {
	var runs []PublishedRun
	for _, r := range []struct {
		nodes, perDP, batch int
		step                float64
	}{{64, 288, 1152, 55.134}, {256, 72, 1152, 14.220}, {304, 64, 1216, 12.729}, {320, 56, 1120, 11.174}, {1024, 24, 1536, 5.180}} {
		gpus := 8 * r.nodes
		runs = append(runs, PublishedRun{Source: "MLPerf Training v5.0, NVIDIA Eos (H100), Llama 3.1 405B (FP8)", Name: fmt.Sprintf("Llama 3.1 405B ×%d", gpus),
			Shape: mlperfLlama405(8), GPUs: gpus, TP: 8, PP: 8, CP: 2, VPP: 8, Batch: r.batch, MicroBatch: 1, SequenceParallel: true, Recompute: "none",
			Precision: "fp8", Zero: 1, Overlap: true, OverlapTP: true, FP8Params: true, Hardware: "h100-sxm", StepSeconds: r.step,
			Checked: "mlcommons/training_results_v5.0 " + fmt.Sprintf("NVIDIA/benchmarks/llama31_405b/implementations/eos-dfw_n%d_ngc25.01_nemo/config_DGXH100_%dx8x%dxtp8pp8cp2.sh ", r.nodes, r.nodes, r.perDP) +
				"and its config_common.sh (tp 8, pp 8, interleaving 8, cp 2, microbatch 1, TP_COMM_OVERLAP, FP8, FP8_PARAMS, USE_DIST_OPTIMIZER, " +
				fmt.Sprintf("OVERLAP_GRAD_REDUCE, OVERLAP_PARAM_GATHER); NVIDIA/results/eos-dfw_n%d_ngc25.01_nemo/llama31_405b/result_*.txt ", r.nodes) +
				"(global_batch_size, gradient_accumulation_steps and every train_step_time; the median); NVIDIA/systems: H100-SXM5-80GB",
			Assumed: "126 layers priced as 128 (see mlperfLlama405); the attention core in bf16; the reduce-scatter in fp32"})
	}
	return runs
}
