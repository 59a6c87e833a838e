"""`--model diffusers --model-path DIR`: any local diffusers video pipeline, by its
`model_index.json`.

The folder names its pipeline class (`_class_name`) and one subfolder per component; the
layout is checked first (`check_layout`, also run by the wan and hunyuan loaders), so a
wrong folder is one error line before diffusers loads anything. The pipeline is loaded with
`local_files_only=True` and called the way the built-in families are:

* Clip defaults are the `__call__` signature's (steps, frames, height, width); a default the
  pipeline leaves as None is resolved as diffusers' video pipelines do it (a `default_height`
  attribute, or the transformer's `sample_height` in latents times the VAE's spatial factor),
  and a frame count with no default must be given.
* The settings are checked against the loaded pipeline's VAE factors and transformer patch
  size before the first clip (`check`); what the config does not say, the pipeline's own
  `check_inputs` refuses, and that refusal becomes the same one-line error.
* The initial noise is drawn on the CPU from the seed (`seeded_noise`) and handed to the
  pipeline as its `latents`. The latent shape (frames first or channels first, packed into
  tokens or not) is each pipeline's own, and only its `prepare_latents` knows it; so for the
  duration of a call that method is wrapped: it is run once with a throwaway copy of the
  generator to learn the shape, dtype and device, then again with the seeded noise as
  `latents`, which the pipeline treats exactly as latents a caller passed.
* Progress comes from `callback_on_step_end`, or, for a pipeline without it, from the
  scheduler's step counter read before each transformer call.

Everything else (guidance, negative prompt, scheduler) is the pipeline's own default.
"""

from __future__ import annotations

import importlib
import inspect
import json
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import torch

from vcbench.errors import UserError
from vcbench.pipelines.loaded import ClipSettings, LoadedModel, seeded_noise, step_callback

INDEX = "model_index.json"
# What a video pipeline's __call__ must take for vcbench to make a clip with it.
CALL_PARAMETERS = ("prompt", "num_frames", "height", "width", "num_inference_steps", "generator",
                   "output_type")
WEIGHTS = ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.ckpt", "*.gguf")
# The pipeline attributes diffusers' video pipelines keep their VAE factors under.
SPATIAL_FACTORS = ("vae_scale_factor_spatial", "vae_spatial_compression_ratio", "vae_spatial_scale_factor")
TEMPORAL_FACTORS = ("vae_scale_factor_temporal", "vae_temporal_compression_ratio",
                    "vae_temporal_scale_factor")


def check_layout(path: Path) -> dict[str, Any]:
    """`path`'s model_index.json, after checking that every component it names has its
    subfolder with what loading it reads first (a model's config.json and weights, a
    scheduler's scheduler_config.json). One UserError names the first thing missing."""
    path = Path(path)
    index_file = path / INDEX
    if not index_file.is_file():
        modular = " (a modular pipeline's folder, which --model diffusers does not load)" \
            if (path / "modular_model_index.json").is_file() else ""
        raise UserError(f"{path} has no {INDEX}{modular}: give the folder a diffusers pipeline "
                        "was saved to (save_pretrained / a downloaded snapshot)")
    try:
        index = json.loads(index_file.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise UserError(f"{index_file} is not readable JSON: {e}") from None
    if not isinstance(index, dict) or not isinstance(index.get("_class_name"), str):
        raise UserError(f"{index_file} names no pipeline class (_class_name)")
    for name, entry in components(index).items():
        library, class_name = entry
        cls = _library_class(library, class_name, f"{index_file}: component {name!r}")
        sub = path / name
        if not sub.is_dir():
            raise UserError(f"{path}: {INDEX} lists component {name!r} ({class_name}) but the "
                            f"folder has no {name}/ subfolder")
        if isinstance(cls, type) and issubclass(cls, torch.nn.Module):
            if not (sub / "config.json").is_file():
                raise UserError(f"{sub} has no config.json (component {name!r}, {class_name})")
            if not any(any(sub.glob(pattern)) for pattern in WEIGHTS):
                raise UserError(f"{sub} has no weights file (component {name!r}, {class_name})")
        elif class_name.endswith("Scheduler") and not (sub / "scheduler_config.json").is_file():
            raise UserError(f"{sub} has no scheduler_config.json (component {name!r}, {class_name})")
        elif not any(sub.iterdir()):
            raise UserError(f"{sub} is empty (component {name!r}, {class_name})")
    return index


def components(index: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """The components a model_index.json names: {name: (library, class)}; a component saved
    as [null, null] (absent) is left out."""
    return {name: (entry[0], entry[1]) for name, entry in index.items()
            if not name.startswith("_") and isinstance(entry, list) and len(entry) == 2
            and isinstance(entry[0], str) and isinstance(entry[1], str)}


def _library_class(library: str, class_name: str, where: str) -> Any:
    # diffusers records a library by its top-level package ("diffusers", "transformers") or, for
    # a pipeline-local class, by its module path.
    try:
        module = importlib.import_module(library)
    except ImportError:
        raise UserError(f"{where} comes from {library!r}, which is not installed") from None
    cls = getattr(module, class_name, None)
    if cls is None:
        version = getattr(module, "__version__", None)
        raise UserError(f"{where} is {library}.{class_name}, which {library}"
                        f"{' ' + version if version else ''} lacks")
    return cls


def pipeline_class(index: dict[str, Any], path: Path) -> type:
    """The diffusers pipeline class model_index.json names, checked to be a text-to-video
    pipeline with a transformer vcbench can patch."""
    import diffusers

    name = index["_class_name"]
    cls = getattr(diffusers, name, None)
    if cls is None:
        raise UserError(f"{path / INDEX} names pipeline class {name!r}, which diffusers "
                        f"{diffusers.__version__} lacks")
    if not (isinstance(cls, type) and issubclass(cls, diffusers.DiffusionPipeline)):
        raise UserError(f"{path / INDEX} names {name!r}, which is not a diffusers pipeline class")
    if not any(n.startswith("transformer") for n in components(index)):
        raise UserError(f"{name} has no transformer component: vcbench patches a diffusion "
                        "transformer's attention (a UNet pipeline cannot be run)")
    params = inspect.signature(cls.__call__).parameters
    missing = [p for p in CALL_PARAMETERS if p not in params]
    if missing:
        raise UserError(f"{name}.__call__ takes no {', '.join(missing)}: --model diffusers "
                        "runs text-to-video pipelines")
    required = [p.name for p in list(params.values())[1:] if p.default is inspect.Parameter.empty
                and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if required:
        raise UserError(f"{name}.__call__ needs {', '.join(required)} besides a prompt: "
                        "--model diffusers runs text-to-video pipelines")
    return cls


def load_diffusers(path: Path, device: torch.device, dtype: torch.dtype) -> LoadedModel:
    index = check_layout(path)
    cls = pipeline_class(index, path)
    pipe = cls.from_pretrained(path, dtype=dtype, local_files_only=True)
    pipe.to(device)
    pipe.set_progress_bar_config(disable=True)
    return LoadedModel(f"diffusers:{cls.__name__}", pipe, clip_defaults(pipe), call_pipeline,
                       device, dtype, check=lambda s: check_settings(pipe, s))


def clip_defaults(pipe: Any) -> ClipSettings:
    """The `__call__` defaults; a None one resolved as the pipeline would (0: no default)."""
    params = inspect.signature(type(pipe).__call__).parameters
    default = {name: params[name].default for name in ("num_inference_steps", "num_frames", "height", "width")}
    config = getattr(getattr(pipe, "transformer", None), "config", {})
    spatial = _factor(pipe, SPATIAL_FACTORS)
    for side in ("height", "width"):
        if default[side] is None:
            sample = config.get(f"sample_{side}")
            default[side] = getattr(pipe, f"default_{side}", None) or (
                sample * spatial if sample and spatial else None)
    if default["num_frames"] is None:
        default["num_frames"] = getattr(pipe, "default_frames", None)
    return ClipSettings(steps=default["num_inference_steps"] or 0, frames=default["num_frames"] or 0,
                        height=default["height"] or 0, width=default["width"] or 0)


def check_settings(pipe: Any, s: ClipSettings) -> None:
    """Frames 1 + a multiple of the VAE's temporal factor; sides multiples of its spatial
    factor times the transformer's patch size; then the pipeline's own `check_inputs` (its
    rules the config does not show, e.g. LTX-Video's multiples of 32)."""
    name = type(pipe).__name__
    temporal = _factor(pipe, TEMPORAL_FACTORS)
    if temporal and (s.frames - 1) % temporal:
        raise UserError(f"{name} needs a frame count of {temporal}k+1 (its VAE compresses time "
                        f"{temporal}x), got {s.frames}")
    spatial = _factor(pipe, SPATIAL_FACTORS)
    if spatial:
        patch = getattr(getattr(pipe, "transformer", None), "config", {}).get("patch_size", 1) or 1
        patch = patch if isinstance(patch, int) else patch[-1]
        side = spatial * patch
        if s.height % side or s.width % side:
            raise UserError(f"{name} needs height and width divisible by {side} (VAE {spatial}x, "
                            f"patch {patch}), got {s.height}x{s.width}")
    _check_inputs(pipe, s)


def _check_inputs(pipe: Any, s: ClipSettings) -> None:
    """`pipe.check_inputs` with the clip's settings and, for its other arguments, `__call__`'s
    defaults (what a call with a prompt alone passes it); skipped when it takes an argument
    neither gives."""
    check = getattr(pipe, "check_inputs", None)
    if check is None:
        return
    call = inspect.signature(type(pipe).__call__).parameters
    given = {"prompt": "a prompt", "height": s.height, "width": s.width, "num_frames": s.frames,
             "num_inference_steps": s.steps}
    args = {}
    for arg, p in inspect.signature(check).parameters.items():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if arg in given:
            args[arg] = given[arg]
        elif arg in call and call[arg].default is not inspect.Parameter.empty:
            args[arg] = call[arg].default
        elif p.default is inspect.Parameter.empty:
            return
    try:
        check(**args)
    except ValueError as e:
        raise UserError(f"{type(pipe).__name__}: {' '.join(str(e).split())}") from None


def _factor(pipe: Any, names: tuple[str, ...]) -> int | None:
    for name in names:
        value = getattr(pipe, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def call_pipeline(model: LoadedModel, prompt: str, generator: torch.Generator, s: ClipSettings, on_step):
    pipe = model.pipe
    params = inspect.signature(type(pipe).__call__).parameters
    kwargs = dict(prompt=prompt, height=s.height, width=s.width, num_frames=s.frames,
                  num_inference_steps=s.steps, generator=generator, output_type="np")
    with ExitStack() as stack:
        if "callback_on_step_end" in params:
            kwargs["callback_on_step_end"] = step_callback(on_step)
        else:  # no step callback: report progress from the scheduler's own counter
            stack.enter_context(_progress_from_scheduler(pipe, on_step))
        if "latents" in params:
            stack.enter_context(seeded_latents(pipe, generator))
        try:
            out = pipe(**kwargs)
        except UserError:
            raise
        except ValueError as e:
            if _raised_in(e, pipe, "check_inputs"):  # the pipeline refused the settings
                raise UserError(f"{type(pipe).__name__}: {' '.join(str(e).split())}") from None
            raise
    on_step(s.steps)
    return out.frames


@contextmanager
def seeded_latents(pipe: Any, generator: torch.Generator) -> Iterator[None]:
    """While active, `pipe.prepare_latents` gets the seed's CPU noise as its `latents`."""
    original = getattr(pipe, "prepare_latents", None)
    signature = inspect.signature(original) if original is not None else None
    if signature is None or not {"latents", "generator"} <= set(signature.parameters):
        yield  # the pipeline draws its own noise, from the same CPU generator
        return

    def prepare(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        if bound.arguments.get("latents") is not None:
            return original(*args, **kwargs)
        throwaway = torch.Generator("cpu").set_state(generator.get_state())
        bound.arguments["generator"] = throwaway
        probe = original(*bound.args, **bound.kwargs)
        if not isinstance(probe, torch.Tensor):  # (latents, conditions...): not a plain T2V shape
            return original(*args, **kwargs)
        bound.arguments["generator"] = generator
        bound.arguments["latents"] = seeded_noise(generator, tuple(probe.shape), probe.device, probe.dtype)
        return original(*bound.args, **bound.kwargs)

    pipe.prepare_latents = prepare  # an instance attribute over the class's method
    try:
        yield
    finally:
        del pipe.prepare_latents


@contextmanager
def _progress_from_scheduler(pipe: Any, on_step) -> Iterator[None]:
    from vcbench.pipelines.patch import denoisers

    def report(module, args):
        on_step(getattr(pipe.scheduler, "step_index", None) or 0)
    handles = [m.register_forward_pre_hook(report) for m in denoisers(pipe).values()]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _raised_in(error: BaseException, pipe: Any, method: str) -> bool:
    """Whether `error` came out of `pipe.<method>`."""
    tb = error.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code.co_name == method and frame.f_locals.get("self") is pipe:
            return True
        tb = tb.tb_next
    return False
