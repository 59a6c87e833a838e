"""Device check: a patched transformer under torch.compile and CUDA graphs, backend="gpu".

    PYTHONPATH=. python benchmarks/checks/compile_gpu.py --out $OUT      (about 3 minutes)

For each method, the tiny-wan-random transformer on CUDA (bf16 weights, 1536 video tokens, one
call), patched with `vcbench.patch(pipe, method, backend="gpu")`:
  explain  `torch._dynamo.explain`: graphs and breaks (the goal: 1 graph, 0 breaks);
  inductor `torch.compile(fullgraph=True)`: compile time, the largest difference from eager
           (attention is the op's own bits, Inductor reassociates the rest), and the eager and
           compiled transformer call's time (median of 20, CUDA events);
  graphs   `mode="reduce-overhead"`: runs and matches, and whether Inductor captured CUDA
           graphs (the patch ops are cudagraph_unsafe by design: their bodies hold the run's
           state, so a graph holding them is run without capture; the count says so);
  schedule vc-8bit over a 20-step schedule: the number of Dynamo graphs (the stated bound: 1).
Then the host overhead of one attention call (B1 H2 N256 D128, bf16): eager `vcbench.attention`
against a compiled function that calls the op, microseconds per call, mean over 300 calls.
Rows go to stdout and OUT/compile-gpu.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import traceback
from pathlib import Path

import torch

import vcbench
from vcbench.kernels import ops

METHODS = ("bf16", "sage2-8bit", "fp8-fa4", "vc-8bit", "vc-8bit-fp8qk")


def _inputs(seed: int, device: str, dtype: torch.dtype) -> dict:
    g = torch.Generator().manual_seed(seed)
    # 4 latent frames of 32 x 48 -> 4 x 16 x 24 = 1536 video tokens
    return dict(hidden_states=torch.randn(1, 16, 4, 32, 48, generator=g).to(device, dtype),
                timestep=torch.tensor([500], device=device),
                encoder_hidden_states=torch.randn(1, 16, 64, generator=g).to(device, dtype))


def _call(model, inputs):
    with torch.no_grad():
        return model(**inputs, return_dict=False)[0]


def _ms(fn, reps: int = 20) -> float:
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def _diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max())


def check_method(tiny, method: str) -> dict:
    from torch._dynamo.utils import counters

    model = tiny.pipe.transformer
    inputs = _inputs(0, "cuda", next(model.parameters()).dtype)
    row: dict = {"method": method}
    with vcbench.patch(tiny.pipe, method, backend="gpu") as p:
        eager = _call(model, inputs)
        row["eager_ms"] = _ms(lambda: _call(model, inputs))
        torch._dynamo.reset()
        explained = torch._dynamo.explain(model)(**inputs, return_dict=False)
        row["graphs"], row["breaks"] = explained.graph_count, explained.graph_break_count
        row["break_reasons"] = [str(r.reason)[:200] for r in explained.break_reasons[:3]]
        torch._dynamo.reset()
        compiled = torch.compile(model, fullgraph=True)
        t0 = time.perf_counter()
        out = _call(compiled, inputs)
        torch.cuda.synchronize()
        row["compile_s"] = round(time.perf_counter() - t0, 1)
        row["inductor_diff"] = _diff(out, eager)
        row["inductor_repeat_equal"] = bool(torch.equal(_call(compiled, inputs), out))
        row["compiled_ms"] = _ms(lambda: _call(compiled, inputs))
        torch._dynamo.reset()
        counters.clear()
        graphed = torch.compile(model, mode="reduce-overhead", fullgraph=True)
        outs = [_call(graphed, inputs) for _ in range(3)]
        row["cudagraph_diff"] = max(_diff(o, eager) for o in outs)
        row["cudagraph_skips"] = sum(counters["inductor"].get(k, 0) for k in counters["inductor"]
                                     if "cudagraph_skip" in k)
        row["cudagraph_ms"] = _ms(lambda: _call(graphed, inputs))
        row["routed_calls"] = sum(p.routed.values())
    torch._dynamo.reset()
    return row


def schedule_graphs(tiny, steps: int = 20) -> dict:
    graphs = []

    def keep(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    model, scheduler = tiny.pipe.transformer, tiny.pipe.scheduler
    dtype = next(model.parameters()).dtype
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=keep, fullgraph=True)
    scheduler.set_timesteps(steps)
    with vcbench.patch(tiny.pipe, "vc-8bit", backend="gpu") as p:
        for step in range(steps):
            scheduler._step_index = step
            _call(compiled, _inputs(step, "cuda", dtype))
        actions = sorted(set(p.actions.values()))
    scheduler._step_index = None
    torch._dynamo.reset()
    return {"steps": steps, "graphs": len(graphs), "actions": actions}


def host_overhead(method: str, reps: int = 300) -> dict:
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(1, 2, 256, 128, device="cuda", dtype=torch.bfloat16, generator=g)
               for _ in range(3))
    eager = lambda: vcbench.attention(q, k, v, method, backend="gpu")  # noqa: E731
    torch._dynamo.reset()
    compiled = torch.compile(lambda a, b, c: ops.attention(a, b, c, method, backend="gpu"),
                             fullgraph=True)
    row = {"method": method}
    for name, fn in (("eager", eager), ("compiled", lambda: compiled(q, k, v))):
        for _ in range(10):
            fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
        row[f"{name}_us"] = round((time.perf_counter() - t0) / reps * 1e6, 1)
    torch._dynamo.reset()
    return row


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "results/compile-gpu")))
    ap.add_argument("--methods", default=",".join(METHODS))
    args = ap.parse_args()
    from vcbench.pipelines.registry import load_model

    print("torch", torch.__version__, torch.cuda.get_device_name())
    tiny = load_model("tiny-wan-random", device="cuda")
    methods = args.methods.split(",")
    report: dict = {"torch": torch.__version__, "card": torch.cuda.get_device_name(),
                    "methods": [], "overhead": []}
    for method in methods:
        try:
            row = check_method(tiny, method)
        except Exception as e:  # one method's failure is a row, the others still run
            row = {"method": method, "error": f"{type(e).__name__}: {str(e)[:300]}"}
            traceback.print_exc(limit=4)
        report["methods"].append(row)
        print(json.dumps(row), flush=True)
    try:
        report["schedule"] = schedule_graphs(tiny)
    except Exception as e:
        report["schedule"] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    print("schedule:", json.dumps(report["schedule"]), flush=True)
    for method in methods:
        try:
            report["overhead"].append(host_overhead(method))
        except Exception as e:
            report["overhead"].append({"method": method, "error": f"{type(e).__name__}: {str(e)[:300]}"})
        print(json.dumps(report["overhead"][-1]), flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    tmp = args.out / "compile-gpu.json.tmp"
    tmp.write_text(json.dumps(report, indent=1))
    tmp.replace(args.out / "compile-gpu.json")
    print(f"\n{'method':<15}{'graphs':>7}{'breaks':>7}{'compile s':>10}{'ind diff':>10}"
          f"{'eager ms':>9}{'comp ms':>8}{'cg ms':>7}{'cg skips':>9}{'cg diff':>9}")
    for r in report["methods"]:
        if "error" in r:
            print(f"{r['method']:<15} ERROR {r['error'][:100]}")
            continue
        print(f"{r['method']:<15}{r['graphs']:>7}{r['breaks']:>7}{r['compile_s']:>10}"
              f"{r['inductor_diff']:>10.2e}{r['eager_ms']:>9.2f}{r['compiled_ms']:>8.2f}"
              f"{r['cudagraph_ms']:>7.2f}{r['cudagraph_skips']:>9}{r['cudagraph_diff']:>9.2e}")
    for r in report["overhead"]:
        print(f"host overhead {r['method']:<15} " + (r.get("error") or
              f"eager {r['eager_us']} us, compiled {r['compiled_us']} us per call"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
