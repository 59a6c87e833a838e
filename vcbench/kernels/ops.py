"""`vcbench::attention`: every method and backend as one opaque torch.library custom op.

    out = vcbench.kernels.ops.attention(q, k, v, "vc-8bit", backend="auto", permutation=perm)

A traced graph (torch.compile, torch.export) sees one op per attention call with the right
shape, dtype and strides, instead of tracing into backend selection (importlib, source
hashes), the emulation's Python or a Triton launch Inductor cannot lower. The op's body is
`vcbench.kernels.attention`, so its output is the eager call's, bit for bit.

The schema carries tensors and plain scalars only: q, k, v (HND), the per-call tensors
(`permutation`, `centroids`, RoPE's cos and sin tables), the grid, `sm_scale`, the backend choice, and the method's other
options resolved and serialized as canonical JSON (sorted keys), so equal options make equal
graphs and guards.
"""

from __future__ import annotations

import json
import math
from typing import Any

import torch

from vcbench.errors import UserError
from vcbench.kernels import BACKEND_CHOICES, CALL_OPTIONS, LAYOUTS, get_method
from vcbench.kernels import attention as eager_attention

TENSOR_CALL_OPTIONS = ("permutation", "centroids")


@torch.library.custom_op("vcbench::attention", mutates_args=())
def _attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, method: str, options: str,
                  permutation: torch.Tensor | None, centroids: torch.Tensor | None,
                  grid: list[int] | None, sm_scale: float | None, backend: str,
                  rope_cos: torch.Tensor | None = None,
                  rope_sin: torch.Tensor | None = None) -> torch.Tensor:
    call: dict[str, Any] = dict(json.loads(options))
    for name, value in (("permutation", permutation), ("centroids", centroids),
                        ("grid", None if grid is None else tuple(grid)), ("sm_scale", sm_scale)):
        if value is not None:
            call[name] = value
    rope = None if rope_cos is None else (rope_cos, rope_sin)
    out = eager_attention(q, k, v, method, tensor_layout="HND", backend=backend, rope=rope,
                          **call)
    # Every implementation returns contiguous (B, H, N, D); the fake promises exactly that.
    return out.contiguous()


@_attention_op.register_fake
def _(q, k, v, method, options, permutation, centroids, grid, sm_scale, backend, rope_cos=None,
      rope_sin=None):
    return q.new_empty(q.shape)


def serialize_options(method: str, options: dict[str, Any]) -> str:
    """The method's options other than the per-call ones, defaults filled in, as canonical
    JSON. Unknown options and bad values are UserErrors here, before anything is traced."""
    m = get_method(method)
    resolved = m.resolve(options)
    plain = {n: (list(x) if isinstance(x, tuple) else x)
             for n, x in resolved.items() if n not in CALL_OPTIONS}
    try:
        return _json(plain)
    except TypeError as e:
        raise UserError(f"method {method!r}: options must be plain values to run as an op ({e})") from None


def _json(x: Any) -> str:
    """`json.dumps(x, sort_keys=True)` for the values options take, in plain Python: this runs
    inside compiled callers, and json's C encoder is a builtin Dynamo cannot trace. What JSON
    would have to escape, and NaN or infinity (not JSON), is a TypeError instead."""
    if x is None or isinstance(x, bool):
        return {None: "null", True: "true", False: "false"}[x]
    if isinstance(x, int):
        return repr(int(x))  # a subclass (IntEnum, numpy.float64) writes as the number
    if isinstance(x, float) and math.isfinite(x):
        return repr(float(x))
    if isinstance(x, str) and x.isascii() and x.isprintable() and '"' not in x and "\\" not in x:
        return f'"{x}"'  # nothing in it that JSON escapes
    if isinstance(x, (list, tuple)):
        return "[" + ", ".join([_json(i) for i in x]) + "]"
    if isinstance(x, dict) and all(isinstance(k, str) for k in x):
        return "{" + ", ".join([f"{_json(k)}: {_json(x[k])}" for k in sorted(x)]) + "}"
    raise TypeError(f"{type(x).__name__} {x!r} is not a plain value")


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, method: str,
              tensor_layout: str = "HND", backend: str = "emulate", rope=None,
              **options: Any) -> torch.Tensor:
    """`vcbench.attention` through the custom op: same arguments, same result."""
    if tensor_layout not in LAYOUTS:
        raise UserError(f"tensor_layout must be one of {', '.join(LAYOUTS)}, got {tensor_layout!r}")
    if backend not in BACKEND_CHOICES:
        raise UserError(f"backend must be one of {', '.join(BACKEND_CHOICES)}, got {backend!r}")
    serialized = serialize_options(method, options)
    grid = options.get("grid")
    scale = options.get("sm_scale")
    if rope is not None and not (isinstance(rope, (tuple, list)) and len(rope) == 2):
        raise UserError("rope must be (cos, sin): two tables of the token positions' cosines "
                        "and sines")
    cos, sin = (None, None) if rope is None else rope
    if tensor_layout == "NHD":
        q, k, v = (x.transpose(1, 2) for x in (q, k, v))
        if cos is not None and cos.dim() == 4:  # (1, N, 1, D) in q's NHD layout, read as HND
            cos, sin = cos.transpose(1, 2), sin.transpose(1, 2)
    out = torch.ops.vcbench.attention(
        q, k, v, method, serialized, options.get("permutation"), options.get("centroids"),
        None if grid is None else [int(g) for g in grid], None if scale is None else float(scale),
        backend, cos, sin)
    return out.transpose(1, 2) if tensor_layout == "NHD" else out
