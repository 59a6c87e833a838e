"""`vcbench project-clip`: Wan2.2-T2V-A14B's clip time per method, projected from its parts.

No checkpoint can be downloaded here, but speed does not depend on weight values. So each part
of the pipeline (text encoder, transformer, VAE) is built from its published config with random
weights, directly on the GPU, and timed on the paper's clip (appendix A: 81 frames of 1280x720,
40 steps) by `clip_parts`; `clip_arithmetic` adds the parts up per method:

    clip = text_calls x text call + sum over the steps of cfg_passes x transformer call
           + VAE decode

This module is the command: it refuses what cannot run before any work, times the parts one
in memory at a time into a run folder (`parts`, rewritten after each part), and writes the
`projection` table. With `compile`, the projection gives the compiled clip beside the eager
one, its speedup over the compiled bf16 clip.

Not counted (the same for every method): tokenizing, the scheduler's update, the CFG
combination and converting the decoded video to uint8. The result is a projection and every
table, figure and manifest says so; with the weights, `vcbench generate` measures the clip.
"""

from __future__ import annotations

import itertools
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pandas as pd
import torch

from vcbench.errors import UserError
from vcbench.kernels import REFERENCE_METHOD, get_method
from vcbench.kernels.spec.vsmooth import GroupingSchedule
from vcbench.timing.clip_arithmetic import joined, projection_table
from vcbench.timing.clip_parts import (
    WAN22_720P,
    ClipSpec,
    build_transformer,
    free_memory,
    time_text_encoder,
    time_transformer_method,
    time_vae_decode,
)

COMMAND = "project-clip"
DEFAULT_METHODS = (REFERENCE_METHOD, "sage2-8bit", "fp8-fa4", "vc-8bit-vsmooth", "vc-8bit")


@dataclass
class Request:
    methods: list[str] = field(default_factory=lambda: list(DEFAULT_METHODS))
    repeats: int = 1  # timed transformer calls per kind of step
    text_repeats: int = 3
    vae_repeats: int = 1
    vae_tiling: bool = False
    device: str = "cuda"
    backend: str = "gpu"
    seed: int = 0
    compile: bool = False  # also time each transformer under torch.compile, beside eager


def check_request(req: Request) -> None:
    """Everything that can be refused before any work: no GPU, unknown methods, no kernel."""
    device = torch.device(req.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"{COMMAND} needs a CUDA GPU, and this machine has none")
    if min(req.repeats, req.text_repeats, req.vae_repeats) < 1:
        raise UserError("--repeats, --text-repeats and --vae-repeats must be at least 1")
    if not req.methods:
        raise UserError("--methods is empty")
    for name in req.methods:
        m = get_method(name)
        if req.backend == "gpu":
            from vcbench.kernels import implementation

            if implementation(m) is None:
                raise UserError(f"no GPU kernel for {name!r} on this machine")
    for module, what in (("diffusers", "the Wan transformer and VAE"),
                         ("transformers", "the UMT5 text encoder")):
        import importlib.util

        if importlib.util.find_spec(module) is None:
            raise UserError(f"{COMMAND} needs {module} for {what} (pip install {module})")


def label(spec: ClipSpec, device: torch.device, backend: str = "gpu") -> str:
    card = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    emulated = "" if backend == "gpu" else ", attention emulated in PyTorch, not a kernel"
    return (f"projected from random-weight {spec.name} transformer on {card} "
            f"({spec.source}, {spec.frames} frames {spec.width}x{spec.height}, "
            f"{spec.steps} steps x {spec.cfg_passes} calls{emulated}; RoPE inside each "
            "transformer call, where `rope` says: in the Q/K quantizers or eager)")


def project_clip(req: Request, out: Path, spec: ClipSpec = WAN22_720P,
                 say: Callable[[str], None] = lambda _: None) -> tuple[pd.DataFrame, str]:
    """Time the parts, write `parts` and `projection` to the run folder `out`, return the
    projection and its label. The parts table is rewritten after each part, so a run cut short
    keeps what it measured."""
    from vcbench.pipelines.registry import default_device_dtype
    from vcbench.runs import RunFolder

    check_request(req)
    methods = list(dict.fromkeys([REFERENCE_METHOD, *req.methods]))  # speedups against it, here
    device, dtype = default_device_dtype(req.device)
    text = label(spec, device, req.backend)
    config = {"model": "wan22-t2v-a14b", "random_weights": True, "projected": True,
              "label": text, "steps": spec.steps, "frames": spec.frames, "height": spec.height,
              "width": spec.width, "spec": asdict(spec), "video_tokens": spec.video_tokens(),
              "latent_shape": list(spec.latent_shape()), "methods": methods,
              "repeats": req.repeats, "text_repeats": req.text_repeats,
              "vae_repeats": req.vae_repeats, "vae_tiling": req.vae_tiling,
              "backend": req.backend, "device": str(device), "dtype": str(dtype).replace("torch.", ""),
              "schedule": asdict(GroupingSchedule(spec.steps)),
              **({"compile": True} if req.compile else {})}
    rows: list[dict] = []
    start = time.perf_counter()
    with RunFolder.create(out, COMMAND, config) as run:
        def done(new: list[dict], what: str) -> None:
            rows.extend(new)
            run.table("parts", pd.DataFrame(rows))
            for r in new:
                compiled = f" compiled ({r['compile_s']:.1f} s to compile)" if r.get("compiled") else ""
                say(f"[{time.perf_counter() - start:5.0f} s] {what} {r['kind']}{compiled}: "
                    f"{r['call_s']:.4f} s/call x {r['calls_in_clip']} = {r['total_s']:.2f} s")

        # One part in memory at a time: the text encoder and the VAE are freed when their
        # timing function returns, the transformer after its last method.
        done([time_text_encoder(spec, device, dtype, req.text_repeats, req.seed)], "text encoder")
        free_memory(device)
        model = build_transformer(spec.transformer, device, dtype, req.seed)
        failed: dict[str, str] = {}
        # Eager and compiled apart: a method that fails to compile keeps its eager figures.
        for method, compiled in itertools.product(methods, (False, True) if req.compile else (False,)):
            item = f"{method} compiled" if compiled else method
            try:
                new = time_transformer_method(model, spec, method, req.repeats, req.backend,
                                              device, dtype, req.seed, compiled)
            except Exception as e:  # noqa: BLE001 - one device run: keep timing the others
                failed[item] = "".join(traceback.format_exception(e))
                run.record(item, "error", error=failed[item])
                say(f"transformer {item} FAILED (its traceback is in the manifest):\n"
                    f"{failed[item]}")
            else:
                run.record(item, "ok", implementation=joined(r["implementation"] for r in new))
                done([{"compiled": False, **r} for r in new] if req.compile else new,
                     f"transformer {method}")
            free_memory(device)
        model = None
        free_memory(device)
        done([time_vae_decode(spec, device, req.vae_repeats, req.vae_tiling, req.seed)], "VAE decode")
        free_memory(device)
        table = projection_table(pd.DataFrame(rows), speedups=req.backend == "gpu")
        run.table("projection", table)
        run.json("result.json", {"label": text, "rows": table.to_dict(orient="records")})
        if failed:  # after the others were written; the run is marked failed
            raise RuntimeError(f"{COMMAND}: {', '.join(failed)} failed (tracebacks above and in "
                               f"{run.path / 'manifest.json'}); the other methods are in "
                               f"{run.path / 'projection.csv'}")
    return table, text
