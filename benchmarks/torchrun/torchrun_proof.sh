#!/usr/bin/env bash
# Proof that `torchrun --nproc_per_node=2 -m vcbench generate` shards (method, prompt, seed)
# items over 2 GPUs: every item made once, by the rank that owns it, on that rank's own GPU, with
# the same frames as a single-process run.
#
#   benchmarks/torchrun/torchrun_proof.sh            # 2 CUDA GPUs: NCCL, rank r on cuda:r
#   benchmarks/torchrun/torchrun_proof.sh --cpu      # the same steps with gloo on the CPU (rehearsal)
#
# Runs from the source tree (PYTHONPATH=. is set here; diffusers may come from PYTHONPATH set by
# the caller), needs torch and what `python3 -m vcbench generate --model tiny-wan` needs, nothing
# more. Steps: (1) a distributed preflight under torchrun (backend, device per rank, all-reduce),
# (2) a single-process run on one device, (3) the sharded run under torchrun, with nvidia-smi
# sampled meanwhile, (4) benchmarks/torchrun/torchrun_proof_check.py prints the PASS/FAIL table.
# Environment: PYTHON (python3), WORK (a new temp dir), NPROC (2), METHODS (bf16,fp8-fa4,vc-8bit),
# SEEDS (0,1), BACKEND (emulate), CLIP (generate's --steps/--frames/--height/--width),
# STRICT=1 to require equal frames for every method (bf16 is always required).
set -euo pipefail

MODE=cuda
if [[ "${1:-}" == "--cpu" ]]; then MODE=cpu; elif [[ -n "${1:-}" ]]; then
  sed -n '2,17p' "$0"; exit 2
fi
PY=${PYTHON:-python3}
NPROC=${NPROC:-2}
METHODS=${METHODS:-bf16,fp8-fa4,vc-8bit}
SEEDS=${SEEDS:-0,1}
BACKEND=${BACKEND:-emulate}
if [[ $MODE == cpu ]]; then
  CLIP=${CLIP:-"--steps 2 --frames 5 --height 128 --width 128"}
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
  SINGLE_DEVICE=cpu
else
  CLIP=${CLIP:-"--steps 12 --frames 9 --height 256 --width 256"}  # tiny-wan's defaults
  SINGLE_DEVICE=cuda:0
fi
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
WORK=${WORK:-$(mktemp -d "${TMPDIR:-/tmp}/vcbench-torchrun-proof.XXXXXX")}
mkdir -p "$WORK"
echo "== torchrun proof: mode=$MODE nproc=$NPROC methods=$METHODS seeds=$SEEDS backend=$BACKEND"
echo "== work folder: $WORK   commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"

"$PY" - "$MODE" "$NPROC" <<'EOF'
import sys
import torch
mode, nproc = sys.argv[1], int(sys.argv[2])
print(f"torch {torch.__version__}, cuda available {torch.cuda.is_available()}, "
      f"{torch.cuda.device_count()} GPU(s)")
if mode == "cuda" and torch.cuda.device_count() < nproc:
    sys.exit(f"need {nproc} CUDA GPUs for the proof (or run with --cpu)")
import diffusers, vcbench  # noqa: E401  (fails here, not in every rank, when missing)
print(f"diffusers {diffusers.__version__} from {diffusers.__file__}")
EOF

PROMPTS="$WORK/prompts.jsonl"
printf '%s\n' '{"id": "fox", "prompt": "a red fox running through fresh snow"}' \
              '{"id": "sea", "prompt": "slow waves rolling onto a pebble beach at dusk"}' > "$PROMPTS"
TORCHRUN=("$PY" -m torch.distributed.run --standalone --nproc_per_node="$NPROC")
# shellcheck disable=SC2206
GEN=(-m vcbench generate --model tiny-wan --methods "$METHODS" --prompts "$PROMPTS" --seeds "$SEEDS"
     --backend "$BACKEND" $CLIP)

echo "== 1/4 distributed preflight (torchrun, $NPROC ranks)"
cat > "$WORK/preflight.py" <<'EOF'
import json, os, sys
import torch
import torch.distributed as dist
from vcbench.pipelines import distributed
rank, world = distributed.setup()
device = distributed.device(None) or "cpu"
total = torch.full((1,), float(rank + 1), device=device)
dist.all_reduce(total)
distributed.barrier()
cuda = torch.cuda.is_available()
info = {"rank": rank, "world": world, "local_rank": int(os.environ["LOCAL_RANK"]),
        "backend": dist.get_backend(), "device": device, "all_reduce": total.item(),
        "current_cuda": torch.cuda.current_device() if cuda else None,
        "gpu_name": torch.cuda.get_device_name(torch.device(device)) if device.startswith("cuda") else None}
with open(os.path.join(sys.argv[1], f"preflight.rank{rank}.json"), "w") as f:
    json.dump(info, f)
print("preflight", json.dumps(info), flush=True)
distributed.teardown()
EOF
"${TORCHRUN[@]}" "$WORK/preflight.py" "$WORK"

echo "== 2/4 single process on $SINGLE_DEVICE"
start=$SECONDS
status=0
"$PY" "${GEN[@]}" --device "$SINGLE_DEVICE" --out "$WORK/single" > "$WORK/single.log" 2>&1 || status=$?
echo "   ($((SECONDS - start)) s, exit $status; log: $WORK/single.log)"
[[ $status == 0 ]] || tail -n 20 "$WORK/single.log"

echo "== 3/4 sharded: torchrun --nproc_per_node=$NPROC"
SMI=""
if [[ $MODE == cuda ]] && command -v nvidia-smi >/dev/null; then
  SMI="$WORK/nvidia-smi.csv"
  nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv,noheader -lms 500 > "$SMI" 2>/dev/null &
  SMI_PID=$!
fi
start=$SECONDS
status=0
"${TORCHRUN[@]}" "${GEN[@]}" --out "$WORK/sharded" > "$WORK/sharded.log" 2>&1 || status=$?
echo "   ($((SECONDS - start)) s, exit $status; log: $WORK/sharded.log)"
if [[ -n $SMI ]]; then kill "$SMI_PID" 2>/dev/null || true; wait "$SMI_PID" 2>/dev/null || true; fi
[[ $status == 0 ]] || tail -n 20 "$WORK/sharded.log"

echo "== 4/4 checks"
"$PY" benchmarks/torchrun/torchrun_proof_check.py --work "$WORK" --methods "$METHODS" --prompts "$PROMPTS" \
  --seeds "$SEEDS" --nproc "$NPROC" --mode "$MODE" ${SMI:+--smi "$SMI"} ${STRICT:+--strict}
