"""A method as data, from a YAML or TOML file: a `Plan` spelled in the spec's building blocks,
plus the plan fields a user may override with `--option NAME.FIELD=VALUE`.

    name: int8-pertensor-qk
    q: {format: int8, granularity: per-tensor}
    k: {format: int8, granularity: per-tensor}
    v: {format: e4m3, granularity: per-channel}
    p: {encoder: expcast, beta: -0.35}
    smooth_k: true
    options:
      p.beta: ExpCast's centring constant

`load_method_file(path)` returns a `FileMethod`: a `Method` whose `path` and `sha256` (of the
file's bytes) say where it came from. Its bits and smoothing are read off the plan, not typed a
second time. The file is checked whole before anything runs, and every mistake (an unknown key,
a value the spec does not take, a combination no kernel computes) is one UserError naming the
file and the field: a typo must never quietly fall back to a default. docs/extending.md has
the schema; the emulation runs any plan it admits, a GPU backend the ones its `supports` takes.
"""

from __future__ import annotations

import copy
import difflib
import hashlib
import math
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from vcbench.errors import UserError
from vcbench.kernels.spec.expcast import DEFAULT_BETA
from vcbench.kernels.spec.formats import BF16, E2M1, E4M3, INT8
from vcbench.kernels.spec.granularity import (
    Microscale16,
    PerBlock,
    PerChannel,
    PerTensor,
    PerWarp,
    Quantizer,
    Unscaled,
)
from vcbench.kernels.spec.method import COMMON_OPTIONS, Method, Option, Plan
from vcbench.kernels.spec.methods.vc import VSMOOTH_OPTIONS
from vcbench.kernels.spec.probability import ExpCast, ExpThenCast, NVFP4Probability
from vcbench.kernels.spec.vsmooth import ORDERS, VSmoothConfig

SUFFIXES = (".yaml", ".yml", ".toml")
# A name is a run-folder component and the part before the first "." of --option NAME.FIELD=V;
# "+" starts a variant's flags and "," separates --methods.
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")

FORMATS = {"int8": INT8, "e4m3": E4M3, "e2m1": E2M1, "bf16": BF16}
GRANULARITIES = ("per-tensor", "per-block", "per-warp", "per-channel", "microscale16", "unscaled")
# What each operand can take. A per-channel scale varies along the head dim, the contraction
# axis of Q K^T, so it cannot factor out of the scores; per-warp splits the query tile.
OPERAND_GRANULARITIES = {
    "q": ("per-tensor", "per-block", "per-warp", "microscale16", "unscaled"),
    "k": ("per-tensor", "per-block", "microscale16", "unscaled"),
    "v": ("per-tensor", "per-block", "per-channel", "microscale16", "unscaled"),
}
GRANULARITY_KEYS = {"per-block": ("rows",), "per-warp": ("rows",),
                    "microscale16": ("axis", "global_scale")}
QUANTIZER_KEYS = ("format", "granularity", "rows", "axis", "global_scale")
# Microscales run along the contraction axis of the product each operand enters by default.
CONTRACTION_AXIS = {"q": -1, "k": -1, "v": -2}

ENCODER_KEYS = {"exp-then-cast": ("format", "scale"), "expcast": ("beta",),
                "nvfp4": ("two_level",)}
P_FORMATS = ("e4m3", "bf16")
# ExpCast puts the row maximum at code round(120 + beta): 120 only for |beta| < 1/2.
EXPCAST_BETA_BOUND = 0.5

VSMOOTH_DEFAULTS = VSmoothConfig()
VSMOOTH_KEYS = ("order", "clusters", "iters", "warm_iters", "cube", "hadamard_v")
# The V-Smooth options every V-Smooth method takes (spec/methods/vc.py), by file field.
VSMOOTH_OPTION_OF = {"order": "vsmooth_order", "clusters": "vsmooth_clusters",
                     "iters": "vsmooth_iters", "warm_iters": "vsmooth_warm_iters",
                     "cube": "vsmooth_cube", "hadamard_v": "hadamard_v"}

FLAGS = ("smooth_k", "smooth_q", "hadamard_qk", "fold_scale_into_q")
PLAN_KEYS = ("q", "k", "v", "p", *FLAGS, "vsmooth", "accum", "block_m", "block_n")
TOP_KEYS = ("name", "summary", *PLAN_KEYS, "options")
ACCUMULATORS = ("fp32", "fp22")
TILES = COMMON_OPTIONS["block_m"].choices  # the block sizes the spec (and --option) takes

# Plan fields an `options:` entry may name, with what --option checks before the plan does.
_ENUMS = {"format": tuple(FORMATS), "granularity": GRANULARITIES}
OPTION_FIELDS: dict[str, Option] = {
    **{f"{x}.{key}": Option(None, "", choices=_ENUMS.get(key),
                            types={"rows": (int,), "axis": (int,), "global_scale": (bool,)}.get(key))
       for x in "qkv" for key in QUANTIZER_KEYS},
    "p.encoder": Option(None, "", choices=tuple(ENCODER_KEYS)),
    "p.format": Option(None, "", choices=P_FORMATS),
    "p.scale": Option(None, "", types=(int, float)),
    "p.beta": Option(None, "", types=(int, float)),
    "p.two_level": Option(None, "", types=(bool,)),
    **{flag: Option(None, "", types=(bool,)) for flag in FLAGS},
    "accum": Option(None, "", choices=ACCUMULATORS),
    "block_m": COMMON_OPTIONS["block_m"],
    "block_n": COMMON_OPTIONS["block_n"],
}


class _Invalid(Exception):
    """A field the spec does not take: `field` (dotted path) and why."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field, self.message = field, message


@dataclass(frozen=True)
class FileMethod(Method):
    """A Method loaded from a method file. `path` is the file as given, `sha256` the hex
    digest of its bytes: a run folder records both, so a result names the exact recipe."""

    path: str = ""
    sha256: str = ""

    def resolve(self, given):
        """As Method.resolve, and the plan those options give is checked too: an override the
        spec does not take (`k.rows=48` on 128-key tiles) is an error before anything runs."""
        opts = super().resolve(given)
        self.build(opts)
        return opts


# ---- reading values ------------------------------------------------------------------------

def _show(value: Any) -> str:
    """A value as the file spells it: 'text', true, null, 3."""
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "null"}[value]
    return repr(value) if isinstance(value, str) else str(value)


def _choice(value: Any, field: str, choices) -> str:
    if not isinstance(value, str) or value not in choices:
        raise _Invalid(field, f"{_show(value)} is not one of {', '.join(choices)}")
    return value


def _bool(value: Any, field: str) -> bool:
    if not isinstance(value, bool):
        raise _Invalid(field, f"expects true or false, got {_show(value)}")
    return value


def _int(value: Any, field: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _Invalid(field, f"expects an integer, got {_show(value)}")
    if value < low:
        raise _Invalid(field, f"must be at least {low}, got {value}")
    return value


def _number(value: Any, field: str) -> float:
    finite = (not isinstance(value, bool) and isinstance(value, (int, float))
              and abs(value) < math.inf)  # an int past float's range compares, never converts
    if not finite:
        raise _Invalid(field, f"expects a finite number, got {_show(value)}")
    return float(value)


def _mapping(value: Any, field: str, keys, what: str) -> dict:
    """A mapping whose keys are all in `keys`; None values count as absent."""
    if not isinstance(value, dict):
        raise _Invalid(field, f"expects a mapping of {', '.join(keys)}, got {_show(value)}")
    _no_unknown(value, field, keys, what)
    return {k: v for k, v in value.items() if v is not None}


def _no_unknown(value: dict, field: str, keys, what: str) -> None:
    for key in value:
        if key not in keys:
            near = difflib.get_close_matches(str(key), keys, n=1)
            hint = f"did you mean {near[0]}?" if near else f"{what} takes {', '.join(keys)}"
            raise _Invalid(f"{field}.{key}" if field else str(key),
                           f"unknown key ({hint})")


def _required(spec: dict, field: str, key: str, what: str) -> Any:
    if key not in spec:
        raise _Invalid(f"{field}.{key}" if field else key, f"missing ({what})")
    return spec[key]


# ---- the plan --------------------------------------------------------------------------------

def _quantizer(value: Any, x: str, block_m: int, block_n: int) -> Quantizer:
    """q, k or v: a format and a granularity with its parameters."""
    spec = _mapping(value, x, QUANTIZER_KEYS, "a quantizer")
    fmt_name = _choice(_required(spec, x, "format", "one of " + ", ".join(FORMATS)),
                       f"{x}.format", FORMATS)
    fmt = FORMATS[fmt_name]
    kind = _choice(_required(spec, x, "granularity", "one of " + ", ".join(GRANULARITIES)),
                   f"{x}.granularity", GRANULARITIES)
    if kind not in OPERAND_GRANULARITIES[x]:
        why = ("a per-channel scale varies along the QK contraction axis and cannot factor "
               "out of the scores" if kind == "per-channel" else "per-warp splits the query tile")
        raise _Invalid(f"{x}.granularity", f"{x.upper()} cannot take {kind} ({why}); it takes "
                                           f"{', '.join(OPERAND_GRANULARITIES[x])}")
    for key in spec:
        if key not in ("format", "granularity", *GRANULARITY_KEYS.get(kind, ())):
            takes = ", ".join(GRANULARITY_KEYS.get(kind, ())) or "no parameters"
            raise _Invalid(f"{x}.{key}", f"{kind} takes {takes}")
    if (fmt is BF16) != (kind == "unscaled"):
        raise _Invalid(f"{x}.granularity" if fmt is BF16 else f"{x}.format",
                       "bf16 operands are unscaled, and only bf16 operands are")
    if fmt is E2M1 and kind != "microscale16":
        raise _Invalid(f"{x}.granularity", "e2m1 needs microscale16 (NVFP4's per-16 E4M3 scales)")

    tile, tile_name = (block_m, "block_m") if x == "q" else (block_n, "block_n")
    if kind in ("per-block", "per-warp"):
        rows = _int(spec.get("rows", tile if kind == "per-block" else PerWarp.rows),
                    f"{x}.rows", 1)
        if x == "v" and rows != tile:
            raise _Invalid(f"{x}.rows", f"per-block V scales cover one KV tile: rows must be "
                                        f"{tile_name} ({tile}), got {rows}")
        if tile % rows:
            raise _Invalid(f"{x}.rows", f"{rows} does not divide {tile_name} ({tile})")
        return Quantizer(fmt, PerBlock(rows) if kind == "per-block" else PerWarp(rows))
    if kind == "microscale16":
        axis = spec.get("axis", CONTRACTION_AXIS[x])
        if isinstance(axis, bool) or axis not in (-1, -2):
            raise _Invalid(f"{x}.axis", f"{_show(axis)} is not one of -1 (head dim), -2 (tokens)")
        return Quantizer(fmt, Microscale16(axis=axis, global_scale=_bool(
            spec.get("global_scale", False), f"{x}.global_scale")))
    return Quantizer(fmt, {"per-tensor": PerTensor, "per-channel": PerChannel,
                           "unscaled": Unscaled}[kind]())


def _p_encoder(value: Any):
    encoders = ", ".join(ENCODER_KEYS)
    if not isinstance(value, dict):
        raise _Invalid("p", f"expects a mapping with an encoder ({encoders}), got {_show(value)}")
    encoder = _choice(_required({k: v for k, v in value.items() if v is not None}, "p",
                                "encoder", encoders), "p.encoder", ENCODER_KEYS)
    spec = _mapping(value, "p", ("encoder", *ENCODER_KEYS[encoder]), f"encoder {encoder}")
    if encoder == "expcast":
        beta = _number(spec.get("beta", DEFAULT_BETA), "p.beta")
        if not abs(beta) < EXPCAST_BETA_BOUND:
            raise _Invalid("p.beta", f"must lie in (-{EXPCAST_BETA_BOUND:g}, "
                                     f"{EXPCAST_BETA_BOUND:g}), or the row maximum's code is not "
                                     f"120; got {beta:g}")
        return ExpCast(beta)
    if encoder == "nvfp4":
        return NVFP4Probability(_bool(spec.get("two_level", True), "p.two_level"))
    fmt = FORMATS[_choice(_required(spec, "p", "format", " or ".join(P_FORMATS)), "p.format",
                          P_FORMATS)]
    scale = _number(spec.get("scale", 1.0), "p.scale")
    if not 0 < scale <= fmt.max:
        raise _Invalid("p.scale", f"must be in (0, {fmt.max:g}] so that the row maximum, 1 x "
                                  f"scale, is in {fmt.name}'s range; got {scale:g}")
    return ExpThenCast(fmt, scale)


def _vsmooth(value: Any, block_n: int, name=lambda key: f"vsmooth.{key}") -> VSmoothConfig:
    """The V-Smooth config; `name` spells a field in errors (a file field or an option)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _Invalid("vsmooth", f"expects null or a mapping of {', '.join(VSMOOTH_KEYS)} "
                                  f"({{}} for the defaults), got {_show(value)}")
    spec = _mapping(value, "vsmooth", VSMOOTH_KEYS, "vsmooth")

    def get(key):
        return spec.get(key, getattr(VSMOOTH_DEFAULTS, key))

    cube = get("cube")
    if not isinstance(cube, (list, tuple)) or len(cube) != 3:
        raise _Invalid(name("cube"), f"expects three integers (t, h, w), got {_show(cube)}")
    return VSmoothConfig(
        order=_choice(get("order"), name("order"), ORDERS),
        clusters=_int(get("clusters"), name("clusters"), 1),
        iters=_int(get("iters"), name("iters"), 0),
        warm_iters=_int(get("warm_iters"), name("warm_iters"), 0),
        cube=tuple(_int(c, name("cube"), 1) for c in cube),
        hadamard_v=_bool(get("hadamard_v"), name("hadamard_v")), block_rows=block_n)


def _plan(recipe: dict, vsmooth_name=lambda key: f"vsmooth.{key}") -> Plan:
    r = {k: v for k, v in recipe.items() if v is not None or k == "vsmooth"}
    block_m = _tile(r.get("block_m", Plan.block_m), "block_m")
    block_n = _tile(r.get("block_n", Plan.block_n), "block_n")
    q, k, v = (_quantizer(_required(r, "", x, "a quantizer: format and granularity"), x,
                          block_m, block_n) for x in "qkv")
    if k.fmt is not q.fmt:
        raise _Invalid("k.format", f"{k.fmt.name!r} differs from q.format {q.fmt.name!r} "
                                   "(the QK product takes one format)")
    p = _p_encoder(_required(r, "", "p", "the P encoder: exp-then-cast, expcast or nvfp4"))
    vsmooth = _vsmooth(r.get("vsmooth"), block_n, vsmooth_name)
    flags = {f: _bool(r.get(f, getattr(Plan, f)), f) for f in FLAGS}
    accum = _choice(r.get("accum", "fp32"), "accum", ACCUMULATORS)
    return Plan(q=q, k=k, v=v, p=p, vsmooth=vsmooth, accum=accum, block_m=block_m,
                block_n=block_n, **flags)


def _tile(value: Any, field: str) -> int:
    if isinstance(value, bool) or value not in TILES:
        raise _Invalid(field, f"{_show(value)} is not one of {', '.join(map(str, TILES))}")
    return value


def _bits(plan: Plan) -> tuple[int, int]:
    """(QK bits, PV bits): the widest operand of each product."""
    p = plan.p
    p_bits = 8 if isinstance(p, ExpCast) else 4 if isinstance(p, NVFP4Probability) else p.fmt.bits
    return max(plan.q.fmt.bits, plan.k.fmt.bits), max(p_bits, plan.v.fmt.bits)


def _smoothing(plan: Plan) -> str:
    """As the built-ins spell it: "K mean", "K mean, Q block mean", "... + V-Smooth"."""
    parts = ", ".join(s for s, on in (("K mean", plan.smooth_k), ("Q block mean", plan.smooth_q))
                      if on)
    if plan.vsmooth is not None:
        return f"{parts} + V-Smooth" if parts else "V-Smooth"
    return parts or "none"


# ---- options ---------------------------------------------------------------------------------

def _get(recipe: dict, path: str) -> Any:
    """The file's value at `smooth_k` or `q.rows`; None where the file leaves it out."""
    head, _, key = path.partition(".")
    value = recipe.get(head)
    if not key:
        return value
    return value.get(key) if isinstance(value, dict) else None


def _set(recipe: dict, path: str, value: Any) -> None:
    """An option's value into its field; None leaves the field out (the schema's default)."""
    head, _, key = path.partition(".")
    if not key:
        recipe[head] = value
        return
    fields = {k: v for k, v in recipe[head].items() if k != key}
    recipe[head] = fields if value is None else {**fields, key: value}


def _declared_options(value: Any, recipe: dict) -> dict[str, Option]:
    """The `options:` section: FIELD: help line, each default the file's value."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _Invalid("options", f"expects a mapping of plan field to help line, got "
                                  f"{_show(value)}")
    out = {}
    for path, help_line in value.items():
        field = f"options.{path}"
        head, _, key = str(path).partition(".")
        if head == "vsmooth":
            flat = VSMOOTH_OPTION_OF.get(key)
            raise _Invalid(field, f"a V-Smooth method takes V-Smooth's options already"
                                  f"{f' (this one as {flat})' if flat else ''}")
        if path not in OPTION_FIELDS:
            near = difflib.get_close_matches(str(path), OPTION_FIELDS, n=1)
            raise _Invalid(field, "not a plan field" + (f" (did you mean {near[0]}?)" if near
                                                        else ""))
        if not isinstance(help_line, str) or not help_line.strip():
            raise _Invalid(field, "expects a help line (what the option changes)")
        if head in "qkvp" and not isinstance(recipe.get(head), dict):
            raise _Invalid(field, f"the file sets no {head}")
        option, default = OPTION_FIELDS[path], _get(recipe, path)
        if default is None and option.choices:  # left out in the file: "the schema's default"
            option = replace(option, choices=(*option.choices, None))
        out[path] = replace(option, default=default, help=help_line.strip())
    return out


def _vsmooth_options(config: VSmoothConfig) -> dict[str, Option]:
    """V-Smooth's per-call and tuning options, as every V-Smooth method takes them (the
    pipeline's grouping schedule passes `vsmooth=False`, `permutation`, ...), the file's
    values their defaults."""
    defaults = {"vsmooth": True, **{flat: getattr(config, key)
                                    for key, flat in VSMOOTH_OPTION_OF.items()}}
    return {name: replace(opt, default=defaults[name]) if name in defaults else opt
            for name, opt in VSMOOTH_OPTIONS.items()}


def _builder(method: str, recipe: dict, fields: list[str], vsmooth: bool):
    """options -> Plan: the file's recipe with each option written into its field."""

    def vsmooth_name(key):  # a V-Smooth field comes from its option
        return VSMOOTH_OPTION_OF[key]

    def build(opts) -> Plan:
        r = copy.deepcopy(recipe)
        for path in fields:
            _set(r, path, opts[path])
        if vsmooth:
            r["vsmooth"] = ({key: opts[flat] for key, flat in VSMOOTH_OPTION_OF.items()}
                            if opts["vsmooth"] else None)
        try:
            return _plan(r, vsmooth_name)
        except _Invalid as e:
            raise UserError(f"method {method!r}: {e.field}: {e.message}") from None

    return build


# ---- the file --------------------------------------------------------------------------------

class _YamlLoader(yaml.SafeLoader):
    """safe_load that refuses a key given twice (YAML would keep the last one silently)."""


def _mapping_without_duplicates(loader, node, deep=False):
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if not isinstance(key, (str, int, float, bool)):
            continue  # construct_mapping says what is wrong with an unhashable key
        if key in seen:
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}",
                                                    key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_YamlLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
                            _mapping_without_duplicates)


def _parse(path: Path, text: str) -> Any:
    if path.suffix == ".toml":
        try:
            import tomllib
        except ModuleNotFoundError:  # Python 3.10
            raise UserError(f"{path}: TOML method files need Python 3.11 (tomllib); "
                            "write it as YAML") from None
        try:
            return tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise UserError(f"{path}: not valid TOML: {e}") from None
    try:
        return yaml.load(text, Loader=_YamlLoader)  # noqa: S506 (a SafeLoader)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise UserError(f"{path}: not valid YAML: {where}{e.problem or e.context}") from None
    except yaml.YAMLError as e:
        raise UserError(f"{path}: not valid YAML: {' '.join(str(e).split())}") from None


def load_method_file(path: str | Path) -> FileMethod:
    """The method a YAML (.yaml, .yml) or TOML (.toml) file declares; any mistake in it is one
    UserError line: `FILE: FIELD: what is wrong`."""
    path = Path(path)
    if path.suffix not in SUFFIXES:
        raise UserError(f"{path}: a method file ends in {', '.join(SUFFIXES)}")
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise UserError(f"{path}: no such method file") from None
    except OSError as e:
        raise UserError(f"{path}: cannot read it ({e.strerror})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise UserError(f"{path}: not UTF-8 text") from None
    doc = _parse(path, text)
    try:
        return _method(doc, path, hashlib.sha256(data).hexdigest())
    except _Invalid as e:
        raise UserError(f"{path}: {e.field}: {e.message}") from None


def _method(doc: Any, path: Path, sha256: str) -> FileMethod:
    if not isinstance(doc, dict):
        raise _Invalid("(top)", f"a method file is a mapping of {', '.join(TOP_KEYS)}")
    _no_unknown(doc, "", TOP_KEYS, "a method file")
    name = _required(doc, "", "name", "the method's name")
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise _Invalid("name", f"{_show(name)} must be letters, digits, '-' and '_' (it names "
                               "run folders and --option NAME.FIELD=VALUE)")
    summary = doc.get("summary", f"method file {path.name}")
    if not isinstance(summary, str):
        raise _Invalid("summary", f"expects a line of text, got {_show(summary)}")
    recipe = {k: doc[k] for k in PLAN_KEYS if k in doc}
    plan = _plan(recipe)  # the file as written: its errors name the file's fields
    options = _declared_options(doc.get("options"), recipe)
    # every method takes the tiles (COMMON_OPTIONS); `options:` may give them a help line
    tiles = {t: replace(COMMON_OPTIONS[t], default=getattr(plan, t),
                        help=options.pop(t).help if t in options else COMMON_OPTIONS[t].help)
             for t in ("block_m", "block_n")}
    options = {**tiles, **options}
    fields = list(options)
    if plan.vsmooth is not None:
        options.update(_vsmooth_options(plan.vsmooth))
    qk_bits, pv_bits = _bits(plan)
    return FileMethod(name=name, summary=summary, qk_bits=qk_bits, pv_bits=pv_bits,
                      smoothing=_smoothing(plan),
                      build=_builder(name, recipe, fields, plan.vsmooth is not None),
                      options=options, path=str(path), sha256=sha256)
