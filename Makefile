# vcbench: every target sets itself up; `make test` and `make demo` work from a fresh clone.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
# ENV=system: run in the current Python as it is, from this source tree (a GPU machine that has
# torch, triton and vcbench's dependencies but no package registry): no .venv, no install.
ifeq ($(ENV),system)
SETUP   :=
PYTHON  := PYTHONPATH=$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH} $(PY)
VCBENCH := $(PYTHON) -m vcbench
else
SETUP   := setup
PYTHON  := $(BIN)/python
VCBENCH := $(BIN)/vcbench
endif
# torch and torchvision come as a matched pair (lpips imports torchvision); on machines with
# a local wheel cache pip takes them from there.
.DEFAULT_GOAL := help

.PHONY: help setup browser test demo lint
help:
	@echo "make setup   create .venv and install vcbench with its dev tools"
	@echo "make test    run the test suite (CPU; GPU tests skip); installs Chromium first (make browser)"
	@echo "make browser Debian's chromium + chromium-driver for report.html's test (as root with apt; else a note)"
	@echo "make demo    the main job on the embedded tiny default, on CPU"
	@echo "make table1 fig3 fig4 fig5    kernel analyses (synthetic tensors unless the YAML names captures)"
	@echo "make table2 MODEL=tiny|wan22|hunyuan15|minimax-h3|longcat GPU=datacenter|workstation [MODEL_PATH=DIR]"
	@echo "make table3 [MODEL=... MODEL_PATH=DIR]    grouping-schedule ablation"
	@echo "make table4 [MODEL=... MODEL_PATH=DIR]    FP8 scores: vc-8bit-fp8qk against fp8-fa4 (+ timeit on a GPU)"
	@echo "make fig6 [MODEL_PATH=DIR]    attention and clip speedup over bf16 (clip projected without MODEL_PATH); needs a GPU"
	@echo "make fig7    the preprocessing chain fused one stage at a time (Wan2.2 shape); needs a GPU"
	@echo "make kernels the compiled sm_90a attention kernel (needs nvcc; VCBENCH_KERNEL=sm90 uses it)"
	@echo "make lint    ruff"
	@echo "ENV=system   (with any target) the current Python as it is, no .venv: a GPU box without a registry"

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

setup: $(STAMP)

# report.html's test drives a headless Chromium. Install Debian's when it is missing and this
# user can (root with apt-get); anywhere else this only says so, and that one test skips.
browser:
	@if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver; } \
	    || echo "note: apt-get could not install chromium: the report.html browser test will skip"; \
	else echo "note: no chromium/chromedriver (and no root apt-get): the report.html browser test will skip"; fi

test: $(SETUP) browser
	$(PYTHON) -m pytest -q

lint: $(SETUP)
	$(PYTHON) -m ruff check vcbench tests benchmarks examples

# The compiled VC-Attention kernel for Hopper (vcbench/kernels/backends/sm90/csrc): built into
# ~/.cache/vcbench/kernels (VCBENCH_KERNEL_CACHE) on a machine with nvcc and a CUDA torch.
.PHONY: kernels
kernels: $(SETUP)
	$(PYTHON) -m vcbench.kernels.backends.sm90.compiled build

# The whole chain on tiny-wan (the trained ToyWan shipped in the package) on CPU: every method,
# 2 held-out captions x 2 seeds at the model's own size (17 frames of 64x64, 20 steps), scored
# against bf16; the caption check of the weights (20 held-out captions; fails the target below
# 70%); the kernel analyses on small synthetic tensors; one report (report.md, and report.html
# to watch every clip beside bf16). generate resumes, so a rerun only redoes what is missing.
DEMO     := results/demo
METHODS_ALL := bf16,fp8-fa4,sage2-8bit,sage3-4bit,attnqat-tf,vc-8bit,vc-8bit-vsmooth,vc-4bit,vc-8bit-fp8qk
TINY     := --model tiny-wan --prompts experiments/demo-prompts.txt --seeds 0,1
demo: $(SETUP)
	@$(PYTHON) -m vcbench.metrics psnr,ssim,lpips
	$(VCBENCH) generate $(TINY) --methods $(METHODS_ALL) --out $(DEMO)/generate
	$(VCBENCH) score $(DEMO)/generate --metrics psnr,ssim,lpips \
	    --json $(DEMO)/generate/score.json --csv $(DEMO)/generate/score.csv
	$(VCBENCH) check-tiny --strict --out $(DEMO)/check
	$(VCBENCH) analyze expcast --out $(DEMO)/expcast
	$(VCBENCH) run experiments/demo-kernel-error.yaml
	$(VCBENCH) run experiments/demo-token-order.yaml
	$(VCBENCH) report $(DEMO)/generate $(DEMO)/expcast $(DEMO)/kernel-error \
	    $(DEMO)/token-order $(DEMO)/check --out $(DEMO)/report

# --- the paper's tables and figures (docs/report.md) -------------------------------------------
.PHONY: table1 fig3 fig4 fig5 table2 table3 table4 fig6
# Kernel-level analyses: captured tensors if the YAML's `tensors:` names them, else synthetic
# video-like tensors (the tables and figures say which).
table1 fig3 fig4 fig5: $(SETUP)
	$(VCBENCH) run experiments/$@.yaml
	$(VCBENCH) report results/$@ --out results/$@/report

# MODEL=tiny runs tiny-wan (the trained ToyWan) on CPU at the demo's size, labelled so; a real model
# needs its diffusers folder (MODEL_PATH) and a CUDA GPU, checked before anything runs.
MODEL      ?= tiny
GPU        ?= datacenter
MODEL_PATH ?=
PROMPTS    ?=
SEEDS      ?= 0
MODEL_tiny       := tiny-wan
MODEL_wan22      := wan22-t2v-a14b
MODEL_hunyuan15  := hunyuanvideo15
MODEL_minimax-h3 := minimax-h3
MODEL_longcat    := longcat-video
# Table 2's low-bit methods per GPU class; the +Hadamard rows run in a second run with
# hadamard_qk on. bf16 runs alone, and `vcbench score REF RUN` scores every method of RUN
# against its clips.
METHODS_datacenter  := fp8-fa4,sage2-8bit,attnqat-tf,vc-8bit-vsmooth,vc-8bit
METHODS_workstation := sage3-4bit,attnqat-tf,vc-4bit
HADAMARD_datacenter  := fp8-fa4
HADAMARD_workstation := sage3-4bit
# --backend auto: the GPU kernels where a GPU takes the method, else the emulation (on a CPU the
# tiny tables are the emulation's, on a GPU the kernels'), as for the real models.
GEN_tiny := $(TINY) --backend auto
GEN_real  = --model $(MODEL_$(MODEL)) --model-path $(MODEL_PATH) --backend auto --seeds $(SEEDS) \
            $(if $(PROMPTS),--prompts $(PROMPTS))
GEN       = $(if $(filter tiny,$(MODEL)),$(GEN_tiny),$(GEN_real))
# VBench's two dimensions need their weights (VBENCH_CACHE_DIR); the tiny run scores without.
METRICS   = $(if $(filter tiny,$(MODEL)),psnr$(,)ssim$(,)lpips,psnr$(,)ssim$(,)lpips$(,)subject_consistency$(,)imaging_quality)
, := ,
VBENCH    = $(or $(VBENCH_CACHE_DIR),$(HOME)/.cache/vbench)
HAS_GPU   = $(PYTHON) -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'
define need_model
	@test -n "$(MODEL_$(MODEL))" || { echo "error: MODEL=$(MODEL) is not one of tiny, wan22, hunyuan15, minimax-h3, longcat" >&2; exit 2; }
	@test "$(MODEL)" = tiny || test -d "$(MODEL_PATH)" || { echo "error: make $@ MODEL=$(MODEL) needs the $(MODEL_$(MODEL)) diffusers folder: set MODEL_PATH=DIR (now '$(MODEL_PATH)')" >&2; exit 2; }
	@test "$(MODEL)" = tiny || $(HAS_GPU) || { echo "error: make $@ MODEL=$(MODEL) needs a CUDA GPU; this machine has none" >&2; exit 2; }
endef

T2 = results/table2-$(MODEL)-$(GPU)
table2: $(SETUP)
	$(need_model)
	@test -n "$(METHODS_$(GPU))" || { echo "error: GPU=$(GPU) is not one of datacenter, workstation" >&2; exit 2; }
	@test "$(MODEL)" = tiny || for f in dino_model/dino_vitbase16_pretrain.pth pyiqa_model/musiq_spaq_ckpt-358bb6af.pth; do \
	    test -f "$(VBENCH)/$$f" || { echo "error: make table2 scores VBench's two dimensions and needs $(VBENCH)/$$f (set VBENCH_CACHE_DIR)" >&2; exit 2; }; done
	@$(PYTHON) -m vcbench.metrics $(METRICS)
	$(VCBENCH) generate $(GEN) --methods bf16 --out $(T2)/bf16
	$(VCBENCH) generate $(GEN) --methods $(METHODS_$(GPU)) --out $(T2)/generate
	$(VCBENCH) generate $(GEN) --methods $(HADAMARD_$(GPU)) \
	    --option $(HADAMARD_$(GPU)).hadamard_qk=true --out $(T2)/generate-hadamard
	for run in generate generate-hadamard; do \
	    $(VCBENCH) score $(T2)/bf16 $(T2)/$$run --metrics $(METRICS) \
	        --json $(T2)/$$run/score.json || exit $$?; done
	$(VCBENCH) report $(T2)/bf16 $(T2)/generate $(T2)/generate-hadamard --out $(T2)/report

# Table 3: vc-8bit grouping on the leading 25% of steps, the same count spread uniformly, and
# every step; each scored against one bf16 run. Latency is the clip wall clock (a real one on
# a GPU; on CPU the emulation's, labelled so).
T3 = results/table3-$(MODEL)
table3: $(SETUP)
	$(need_model)
	@$(PYTHON) -m vcbench.metrics psnr,ssim,lpips
	$(VCBENCH) generate $(GEN) --methods bf16 --out $(T3)/bf16
	$(VCBENCH) generate $(GEN) --methods vc-8bit --schedule-placement leading --out $(T3)/leading
	$(VCBENCH) generate $(GEN) --methods vc-8bit --schedule-placement uniform --out $(T3)/uniform
	$(VCBENCH) generate $(GEN) --methods vc-8bit --schedule-placement every --out $(T3)/every
	for run in leading uniform every; do \
	    $(VCBENCH) score $(T3)/bf16 $(T3)/$$run --metrics psnr,ssim,lpips \
	        --json $(T3)/$$run/score.json || exit $$?; done
	$(VCBENCH) report $(T3)/bf16 $(T3)/leading $(T3)/uniform $(T3)/every --out $(T3)/report

# Table 4 (paper 4.5): VC-Attention with FP8 scores against the naive FP8 kernel at the same
# precision: PSNR against bf16 and, on a GPU, the attention-call speedup over BF16 FA4 from one
# timeit run (Wan2.2 shape). The heading names this card: the paper's Table 4 is a B300's.
T4 = results/table4-$(MODEL)
T4_METHODS := vc-8bit-fp8qk,fp8-fa4
table4: $(SETUP)
	$(need_model)
	@$(PYTHON) -m vcbench.metrics psnr,ssim,lpips
	$(VCBENCH) generate $(GEN) --methods bf16 --out $(T4)/bf16
	$(VCBENCH) generate $(GEN) --methods $(T4_METHODS) --out $(T4)/generate
	$(VCBENCH) score $(T4)/bf16 $(T4)/generate --metrics psnr,ssim,lpips --json $(T4)/generate/score.json
	runs="$(T4)/bf16 $(T4)/generate"; \
	if $(HAS_GPU); then \
	    $(VCBENCH) timeit --shape wan22-720p --methods $(T4_METHODS) $(TIMEIT_FLAGS) --out $(T4)/timeit \
	        || exit $$?; runs="$$runs $(T4)/timeit"; fi; \
	$(VCBENCH) report $$runs --title "Table 4 (FP8 scores) on {card}" --out $(T4)/report

# Figure 6: attention kernel time on this card (timeit, Wan2.2 720p shape) and the clip wall
# clock per method: measured with Wan2.2 weights (MODEL_PATH), else projected from Wan2.2-A14B's
# parts built from their configs with random weights and timed here (project-clip; REPEATS
# timed transformer calls per kind of step), labelled as projected.
F6         = results/fig6
F6_METHODS = bf16,sage2-8bit,fp8-fa4,vc-8bit-vsmooth,vc-8bit,vc-8bit-fp8qk
REPEATS   ?= 1
F6_CLIP    = $(if $(MODEL_PATH),generate,projection)
fig6: $(SETUP)
	@$(HAS_GPU) || { echo "error: make fig6 needs a CUDA GPU (it times kernels with CUPTI); this machine has none" >&2; exit 2; }
	$(VCBENCH) timeit --shape wan22-720p --methods $(F6_METHODS) --out $(F6)/timeit
	$(if $(MODEL_PATH),$(VCBENCH) generate --model wan22-t2v-a14b --model-path $(MODEL_PATH) \
	    --backend gpu --methods $(F6_METHODS) --out $(F6)/generate,\
	    $(VCBENCH) project-clip --methods $(F6_METHODS) --repeats $(REPEATS) --out $(F6)/projection)
	$(VCBENCH) report $(F6)/timeit $(F6)/$(F6_CLIP) --out $(F6)/report

# Figure 7: one V-Smooth attention call's preprocessing at the Wan2.2 shape (B1 H40 N75600
# D128), fused one stage at a time, each rung a CUPTI time of the whole chain (analyze fusion).
F7 = results/fig7
.PHONY: fig7
fig7: $(SETUP)
	@$(HAS_GPU) || { echo "error: make fig7 needs a CUDA GPU (it times kernels with CUPTI); this machine has none" >&2; exit 2; }
	$(VCBENCH) analyze fusion --shape wan22-720p --out $(F7)
	$(VCBENCH) report $(F7) --out $(F7)/report

.PHONY: bench
# TIMEIT_FLAGS: e.g. "--warmup-s 3 --window-s 3" for a quick look (the defaults are 20 s and 10 s)
TIMEIT_FLAGS ?=
bench: $(SETUP)  ## GPU: kernel timings at the Wan2.2 and LongCat shapes
	$(VCBENCH) timeit --shape wan22-720p $(TIMEIT_FLAGS) --out results/bench-wan22
	$(VCBENCH) timeit --shape longcat-480p $(TIMEIT_FLAGS) --out results/bench-longcat
