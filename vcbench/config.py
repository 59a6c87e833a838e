"""Experiment YAML: one schema, validated on load.

An experiment file names one command and its settings; `vcbench run FILE` executes it.
Every key is declared below; an unknown key, a missing required key or a value of the wrong
kind is an error that names the file, the key path and what was expected. Files are read
with `yaml.safe_load` (no Python objects from YAML).

    name: table1
    command: analyze
    analysis: token-order
    tensors: captures/wan22-l20-s0.safetensors   # absent: synthetic tensors, labelled so
    out: results/table1
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from vcbench.errors import UserError


@dataclass(frozen=True)
class Key:
    """One declared key: what it holds, whether it is required, its default."""

    kind: str  # str | int | float | bool | list[str] | list[int] | dict | map[str, dict] | section
    doc: str
    required: bool = False
    default: Any = None
    choices: tuple | None = None
    section: dict[str, Key] | None = None  # for kind == "section"


SYNTHETIC = {
    "seed": Key("int", "generator seed", default=0),
    "heads": Key("int", "attention heads", default=2),
    "grid": Key("list[int]", "latent grid T, H, W", default=[8, 32, 32]),
    "head_dim": Key("int", "head dimension", default=128, choices=(64, 128)),
}

ANALYSES = ("expcast", "kernel-error", "token-order")
COMMANDS = ("analyze", "generate")

SCHEDULE = {  # V-Smooth grouping schedule (generate); absent keys take the paper's values
    "fraction": Key("float", "share of the steps that group (paper: 0.25)"),
    "refresh_every": Key("int", "regroup every N grouping steps (paper: 4)"),
    "placement": Key("str", "where the grouping steps sit", choices=("leading", "uniform", "every")),
    "after_window": Key("str", "after the window", choices=("plain", "reuse")),
}

SCHEMA: dict[str, Key] = {
    "name": Key("str", "experiment name", required=True),
    "description": Key("str", "what the experiment reproduces", default=""),
    "command": Key("str", "which vcbench command runs it", required=True, choices=COMMANDS),
    "out": Key("str", "run folder (default results/<name>)"),
    # analyze
    "analysis": Key("str", "which analysis (command: analyze)", choices=ANALYSES),
    "beta": Key("float", "ExpCast centring constant (expcast)", default=-0.35),
    "tensors": Key("str", "safetensors file with q, k, v [, grid]; absent = synthetic"),
    "synthetic": Key("section", "synthetic tensors when no file is given", default={},
                     section=SYNTHETIC),
    "methods": Key("list[str]", "methods to run", default=[]),
    "method_options": Key("map[str, dict]", "options per method", default={}),
    # generate (the keys of `vcbench generate`; absent clip settings take the paper's)
    "model": Key("str", "model name (command: generate)"),
    "model_path": Key("str", "local diffusers folder of the model"),
    "lora_path": Key("str", "LoRA weights file (minimax-h3: the 8-step LoRA)"),
    "prompts": Key("str", "prompts file, text or JSONL (absent: the demo prompts)"),
    "seeds": Key("list[int]", "seeds; one seed gives every method the same noise", default=[0]),
    "steps": Key("int", "denoising steps"),
    "frames": Key("int", "frames per clip"),
    "height": Key("int", "frame height"),
    "width": Key("int", "frame width"),
    "schedule": Key("section", "grouping schedule", default={}, section=SCHEDULE),
    "backend": Key("str", "attention backend", default="emulate", choices=("emulate", "gpu", "auto")),
    "device": Key("str", "cpu, cuda, cuda:1 (absent: cuda if present)"),
    "compile": Key("bool", "torch.compile the transformer(s) after patching (generate)",
                   default=False),
}


def _kind_ok(kind: str, value: Any) -> bool:
    if kind == "str":
        return isinstance(value, str)
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "float":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "list[str]":
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    if kind == "list[int]":
        return isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    if kind in ("dict", "section"):
        return isinstance(value, dict)
    if kind == "map[str, dict]":
        return isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, dict)
                                               for k, v in value.items())
    raise AssertionError(f"undeclared kind {kind}")


def validate(data: Any, schema: dict[str, Key], where: str, prefix: str = "") -> dict[str, Any]:
    """Check `data` against `schema`; return it with defaults filled in."""
    if not isinstance(data, dict):
        raise UserError(f"{where}: {prefix or 'top level'} must be a mapping of keys")
    for key in data:
        if key not in schema:
            raise UserError(f"{where}: unknown key '{prefix}{key}' (known: {', '.join(schema)})")
    out: dict[str, Any] = {}
    for key, spec in schema.items():
        path = f"{prefix}{key}"
        if key not in data or data[key] is None:
            if spec.required:
                raise UserError(f"{where}: missing required key '{path}' ({spec.doc})")
            value = spec.default
            if spec.kind == "section":
                value = validate(value or {}, spec.section or {}, where, f"{path}.")
            out[key] = value
            continue
        value = data[key]
        if not _kind_ok(spec.kind, value):
            raise UserError(f"{where}: key '{path}' expects {spec.kind}, got {value!r}")
        if spec.choices is not None and value not in spec.choices:
            raise UserError(f"{where}: key '{path}' must be one of "
                            f"{', '.join(map(str, spec.choices))}, got {value!r}")
        if spec.kind == "section":
            value = validate(value, spec.section or {}, where, f"{path}.")
        out[key] = value
    return out


@dataclass(frozen=True)
class Experiment:
    path: Path
    settings: dict[str, Any] = field(default_factory=dict)

    def __getitem__(self, key: str) -> Any:
        return self.settings[key]


def _check_cross_keys(s: dict[str, Any], where: str) -> None:
    if s["command"] == "analyze" and s["analysis"] is None:
        raise UserError(f"{where}: command 'analyze' needs key 'analysis' "
                        f"({', '.join(ANALYSES)})")
    if s["command"] == "generate":
        _check_generate(s, where)
    grid = s["synthetic"]["grid"]
    if len(grid) != 3 or any(g < 1 for g in grid):
        raise UserError(f"{where}: key 'synthetic.grid' expects three positive integers, got {grid}")
    if s["methods"]:
        from vcbench.kernels import METHODS

        for m in s["methods"]:
            if s["analysis"] == "kernel-error" and "+" in m:  # a variant: fp8-fa4+hadamard_qk
                from vcbench.analysis.variants import parse_variant

                try:
                    parse_variant(m)
                except UserError as e:
                    raise UserError(f"{where}: key 'methods': {e}") from None
            elif m not in METHODS:
                raise UserError(f"{where}: key 'methods' names unknown method {m!r} "
                                f"(known: {', '.join(METHODS)})")
    for m in s["method_options"]:
        if m not in s["methods"]:
            raise UserError(f"{where}: key 'method_options.{m}' is for a method not in 'methods'")


def _check_generate(s: dict[str, Any], where: str) -> None:
    from vcbench.kernels import get_method
    from vcbench.pipelines.registry import MODELS

    if s["model"] is None or s["model"] not in MODELS:
        raise UserError(f"{where}: command 'generate' needs key 'model' "
                        f"({', '.join(MODELS)}), got {s['model']!r}")
    if not s["methods"] or not s["seeds"]:
        raise UserError(f"{where}: command 'generate' needs non-empty keys 'methods' and 'seeds'")
    for key in ("steps", "frames", "height", "width"):
        if s[key] is not None and s[key] < 1:
            raise UserError(f"{where}: key '{key}' must be positive, got {s[key]}")
    for m, opts in s["method_options"].items():
        try:
            get_method(m).resolve({k: tuple(v) if isinstance(v, list) else v for k, v in opts.items()})
        except UserError as e:
            raise UserError(f"{where}: key 'method_options.{m}': {e}") from None


def load_experiment(path: str | Path, overrides: dict[str, Any] | None = None) -> Experiment:
    """Read and validate `path`; `overrides` (`vcbench run --set KEY=VALUE`, KEY may be
    `section.key`) replace the file's values before validation, so they are checked alike."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"experiment file {path} does not exist")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise UserError(f"{path}: not valid YAML{at}") from None
    for key, value in (overrides or {}).items():
        if isinstance(data, dict):
            head, _, sub = key.partition(".")
            if sub and isinstance(data.get(head, {}), dict):
                data[head] = {**(data.get(head) or {}), sub: value}
            else:
                data[key] = value
    settings = validate(data, SCHEMA, str(path))
    _check_cross_keys(settings, str(path))
    if settings["out"] is None:
        settings["out"] = f"results/{settings['name']}"
    return Experiment(path, settings)
