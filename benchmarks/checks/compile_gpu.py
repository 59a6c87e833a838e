"""Device check: a patched transformer under torch.compile and CUDA graphs, backend="gpu".

    PYTHONPATH=. python benchmarks/checks/compile_gpu.py --out $OUT      (about 5 minutes: Inductor
    compiles the tiny transformer ~4 times per method)

For each method, the tiny-wan-random transformer on CUDA (bf16 weights, 1536 video tokens, one
call), patched with `vcbench.patch(pipe, method, backend="gpu")`:
  explain  `torch._dynamo.explain`: graphs and breaks (the goal: 1 graph, 0 breaks);
  inductor `torch.compile(fullgraph=True)`: compile time, the largest difference from eager
           (attention is the op's own bits, Inductor reassociates the rest), and the eager and
           compiled transformer call's time (median of 20, CUDA events);
  regional the same by diffusers' `compile_repeated_blocks` (each block compiled, one graph
           serving all; the goal: 2 graphs);
  graphs   `mode="reduce-overhead"` with graph partitioning off, then on (torch's default):
           runs and matches eager, and Inductor's CUDA-graph skips. The patch ops are
           cudagraph_unsafe by design (their bodies hold the run's state): off, a graph
           holding them is not captured; on, the segments between them are;
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
BACKEND = {"cuda": "gpu", "cpu": "emulate"}  # --device cpu: a smoke run of this script


def _inputs(seed: int, device: str, dtype: torch.dtype) -> dict:
    g = torch.Generator().manual_seed(seed)
    # 4 latent frames of 32 x 48 -> 4 x 16 x 24 = 1536 video tokens
    return dict(hidden_states=torch.randn(1, 16, 4, 32, 48, generator=g).to(device, dtype),
                timestep=torch.tensor([500], device=device),
                encoder_hidden_states=torch.randn(1, 16, 64, generator=g).to(device, dtype))


def _call(model, inputs):
    with torch.no_grad():
        return model(**inputs, return_dict=False)[0]


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _ms(fn, reps: int = 20) -> float:
    times = []
    for _ in range(reps):
        _sync()
        t0 = time.perf_counter()
        fn()
        _sync()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max())


def _stage(row: dict, name: str, fn) -> bool:
    """Run one stage; a failure is recorded in the row (the later stages still run)."""
    try:
        fn()
        return True
    except Exception as e:
        row[f"{name}_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:240]}"
        traceback.print_exc(limit=3)
        return False
    finally:
        torch._dynamo.reset()


def check_method(tiny, method: str, device: str) -> dict:
    from torch._dynamo.utils import counters
    from torch._inductor import config as inductor_config

    model = tiny.pipe.transformer
    inputs = _inputs(0, device, next(model.parameters()).dtype)
    row: dict = {"method": method}
    with vcbench.patch(tiny.pipe, method, backend=BACKEND[device]) as p:
        eager = _call(model, inputs)
        row["eager_ms"] = _ms(lambda: _call(model, inputs))

        def explain():
            explained = torch._dynamo.explain(model)(**inputs, return_dict=False)
            row["graphs"], row["breaks"] = explained.graph_count, explained.graph_break_count
            row["break_reasons"] = [str(r.reason)[:200] for r in explained.break_reasons[:3]]

        def inductor():
            compiled = torch.compile(model, fullgraph=True)
            t0 = time.perf_counter()
            out = _call(compiled, inputs)
            _sync()
            row["compile_s"] = round(time.perf_counter() - t0, 1)
            row["inductor_diff"] = _diff(out, eager)
            row["inductor_repeat_equal"] = bool(torch.equal(_call(compiled, inputs), out))
            row["compiled_ms"] = _ms(lambda: _call(compiled, inputs))

        def regional():
            # diffusers' compile_repeated_blocks: one compiled block serving every block (the
            # goal: 2 graphs, the block that starts the call holds patch_begin)
            from torch._inductor.compile_fx import compile_fx

            graphs = []

            def backend(gm, example_inputs):
                graphs.append(gm)
                return compile_fx(gm, example_inputs)
            model.compile_repeated_blocks(backend=backend, fullgraph=True)
            try:
                t0 = time.perf_counter()
                out = _call(model, inputs)
                _sync()
                row["regional_compile_s"] = round(time.perf_counter() - t0, 1)
                row["regional_graphs"] = len(graphs)
                row["regional_diff"] = _diff(out, eager)
                row["regional_ms"] = _ms(lambda: _call(model, inputs))
            finally:
                for m in model.modules():
                    m._compiled_call_impl = None

        def graphed(partition: bool):
            # reduce-overhead: the patch ops are cudagraph_unsafe (their bodies hold the run's
            # state). With Inductor's graph partitioning (the default since torch 2.9) the
            # segments between attention calls are captured and the ops run eagerly between
            # replays; without it no graph holding them is captured (a skip)
            key = "partition" if partition else "cudagraph"
            counters.clear()
            old = getattr(inductor_config, "graph_partition", None)
            if partition and old is None:
                raise RuntimeError("this torch has no inductor graph_partition")
            if old is not None:
                inductor_config.graph_partition = partition
            try:
                fn = torch.compile(model, mode="reduce-overhead", fullgraph=True)

                def step():
                    torch.compiler.cudagraph_mark_step_begin()
                    return _call(fn, inputs).clone()  # a replay overwrites the graph's output
                outs = [step() for _ in range(3)]
                row[f"{key}_diff"] = max(_diff(o, eager) for o in outs)
                row[f"{key}_skips"] = sum(v for k, v in counters["inductor"].items()
                                          if "cudagraph_skip" in k)
                row[f"{key}_ms"] = _ms(step)
            finally:
                if old is not None:
                    inductor_config.graph_partition = old

        torch._dynamo.reset()
        _stage(row, "explain", explain)
        _stage(row, "regional", regional)
        _stage(row, "inductor", inductor)
        _stage(row, "cudagraph", lambda: graphed(False))
        _stage(row, "partition", lambda: graphed(True))
        row["routed_calls"] = sum(p.routed.values())
    return row


def schedule_graphs(tiny, device: str, steps: int = 20) -> dict:
    graphs = []

    def keep(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    model, scheduler = tiny.pipe.transformer, tiny.pipe.scheduler
    dtype = next(model.parameters()).dtype
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=keep, fullgraph=True)
    scheduler.set_timesteps(steps)
    with vcbench.patch(tiny.pipe, "vc-8bit", backend=BACKEND[device]) as p:
        for step in range(steps):
            scheduler._step_index = step
            _call(compiled, _inputs(step, device, dtype))
        actions = sorted(set(p.actions.values()))
    scheduler._step_index = None
    torch._dynamo.reset()
    return {"steps": steps, "graphs": len(graphs), "actions": actions}


def host_overhead(method: str, device: str, reps: int = 300) -> dict:
    g = torch.Generator(device=device).manual_seed(0)
    q, k, v = (torch.randn(1, 2, 256, 128, device=device, dtype=torch.bfloat16, generator=g)
               for _ in range(3))
    backend = BACKEND[device]
    eager = lambda: vcbench.attention(q, k, v, method, backend=backend)  # noqa: E731
    torch._dynamo.reset()
    compiled = torch.compile(lambda a, b, c: ops.attention(a, b, c, method, backend=backend),
                             fullgraph=True)
    row = {"method": method}
    for name, fn in (("eager", eager), ("compiled", lambda: compiled(q, k, v))):
        for _ in range(10):
            fn()
        _sync()
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        _sync()
        row[f"{name}_us"] = round((time.perf_counter() - t0) / reps * 1e6, 1)
    torch._dynamo.reset()
    return row


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "results/compile-gpu")))
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--device", choices=tuple(BACKEND), default="cuda")
    ap.add_argument("--reps", type=int, default=300, help="calls per host-overhead figure")
    args = ap.parse_args()
    from vcbench.pipelines.registry import load_model

    card = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    print("torch", torch.__version__, card)
    tiny = load_model("tiny-wan-random", device=args.device)
    methods = args.methods.split(",")
    report: dict = {"torch": torch.__version__, "card": card, "methods": [], "overhead": []}
    args.out.mkdir(parents=True, exist_ok=True)

    def save():  # after every row: a call cut short at its time limit keeps what it measured
        tmp = args.out / "compile-gpu.json.tmp"
        tmp.write_text(json.dumps(report, indent=1))
        tmp.replace(args.out / "compile-gpu.json")

    for method in methods:
        try:
            row = check_method(tiny, method, args.device)
        except Exception as e:  # one method's failure is a row, the others still run
            row = {"method": method, "error": f"{type(e).__name__}: {str(e)[:300]}"}
            traceback.print_exc(limit=4)
        report["methods"].append(row)
        save()
        print(json.dumps(row), flush=True)
    try:
        report["schedule"] = schedule_graphs(tiny, args.device)
    except Exception as e:
        report["schedule"] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    print("schedule:", json.dumps(report["schedule"]), flush=True)
    for method in methods:
        try:
            report["overhead"].append(host_overhead(method, args.device, args.reps))
        except Exception as e:
            report["overhead"].append({"method": method, "error": f"{type(e).__name__}: {str(e)[:300]}"})
        save()
        print(json.dumps(report["overhead"][-1]), flush=True)
    save()
    cols = ("graphs", "breaks", "compile_s", "inductor_diff", "eager_ms", "compiled_ms",
            "regional_graphs", "regional_ms",
            "cudagraph_ms", "cudagraph_skips", "partition_ms", "partition_skips")
    print("\n" + f"{'method':<15}" + "".join(f"{c:>16}" for c in cols))
    for r in report["methods"]:
        cells = [r.get(c, "-") for c in cols]
        print(f"{r['method']:<15}" + "".join(
            f"{x:>16.3g}" if isinstance(x, float) else f"{x!s:>16}" for x in cells))
        for k, v in r.items():
            if k.endswith("_error"):
                print(f"    {k}: {v[:150]}")
    for r in report["overhead"]:
        print(f"host overhead {r['method']:<15} " + (r.get("error") or
              f"eager {r['eager_us']} us, compiled {r['compiled_us']} us per call"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
