"""Every GPU backend keeps the non-finite rule of test_nonfinite.py (a CUDA GPU; skipped elsewhere).

For every method (V-Smooth ones also with a given permutation and with vsmooth=False), every
backend that takes it here, and a NaN, +inf or -inf in one (batch, head) of q, k or v: that
(batch, head)'s output is non-finite (all NaN for a quantized method, as the emulation's),
every other (batch, head) is bit for bit the backend's clean output, and the
preprocessing's scales are the emulation's on the same CUDA tensors, NaN in the same places.
The compiled sm_90a backend is built first where nvcc is found and no current build exists.
"""

import os
import shutil

import pytest
import torch
from test_nonfinite import BAD_HEAD, BAD_VALUES, _variants

from vcbench.kernels import backends, get_method
from vcbench.kernels.backends.sm90 import compiled
from vcbench.kernels.reference.engine import emulate, prepare
from vcbench.kernels.reference.vsmooth import group
from vcbench.kernels.spec.granularity import Unscaled
from vcbench.kernels.spec.vsmooth import VSmoothConfig

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                  reason="needs a CUDA GPU")]
B, H, N, D = 2, 3, 300, 128  # 300 tokens: two full KV tiles and a padded one; sm90 needs D 128


@pytest.fixture(scope="module", autouse=True)
def compiled_build():
    """The sm90 backend needs a build of the current sources; the others do not."""
    if (compiled.device_reason() is None and compiled.load() is None
            and (shutil.which("nvcc") or os.environ.get("CUDA_HOME"))):
        compiled.build()


def _inputs():
    g = torch.Generator(device="cuda").manual_seed(31)
    return [torch.randn(B, H, N, D, device="cuda", generator=g).bfloat16() for _ in range(3)]


def _call(method, variant, v):
    m = get_method(method)
    opts = m.resolve({"vsmooth": False} if variant == "vsmooth=False" else {})
    plan = m.build(opts)
    call = {}
    if variant == "permutation":
        call["permutation"] = group(v, VSmoothConfig(block_rows=128)).permutation
    return plan, call


def _same(got, want):
    """Bit-equal, NaN matching NaN."""
    got, want = got.float().reshape(want.shape), want.float()
    return bool(((got == want) | (got.isnan() & want.isnan())).all())


def _scales(ops):
    """(name, preprocessing's, emulation's) pairs of the scales a backend's kernel reads."""
    names = [("q_scale", "q", "scale"), ("k_scale", "k", "scale"), ("v_scale", "v", "scale"),
             ("q_outer", "q", "outer"), ("k_outer", "k", "outer"), ("v_outer", "v", "outer"),
             ("v_mean", "v_mean", None)]
    return [(name, op, part) for name, op, part in names if getattr(ops, name, None) is not None]


@pytest.mark.parametrize("backend", backends.BACKENDS.values(), ids=lambda b: b.name)
@pytest.mark.parametrize("method, variant", _variants())
def test_a_non_finite_input_poisons_its_head_on_every_backend(backend, method, variant):
    q, k, v = _inputs()
    plan, call = _call(method, variant, v)
    why = backend.supports(plan, (B, H, N, D)) or backend.available()
    if why:
        pytest.skip(why)
    clean = backend.run(q, k, v, plan, call)
    quantized = not isinstance(plan.v.granularity, Unscaled)
    others = torch.ones(B, H, dtype=torch.bool)
    others[BAD_HEAD] = False
    for operand in "qkv":
        for bad, value in BAD_VALUES.items():
            poisoned = {"q": q.clone(), "k": k.clone(), "v": v.clone()}
            poisoned[operand][(*BAD_HEAD, 37, 5)] = value
            args = (poisoned["q"], poisoned["k"], poisoned["v"])
            what = f"{bad} in {operand}"
            out = backend.run(*args, plan, call)
            assert torch.equal(out[others], clean[others]), f"{what}: another head changed"
            head = out[BAD_HEAD]
            assert not torch.isfinite(head).all(), f"{what}: the head stayed finite"
            if quantized:  # V's scales carry it: all NaN, as in the emulation
                assert torch.isnan(emulate(*args, plan, **call)[BAD_HEAD]).all()
                assert torch.isnan(head).all(), f"{what}: not all NaN, as the emulation"
            if backend.prepare is None:
                continue
            ops = backend.prepare(*args, plan, **call)
            emu = prepare(*args, plan, permutation=ops.permutation, sm_scale=None)
            for name, op, part in _scales(ops):
                want = getattr(emu, op) if part is None else getattr(getattr(emu, op), part)
                assert _same(getattr(ops, name), want), f"{what}: {name} differs"
