"""vcbench: does a low-bit attention kernel keep a video DiT's output, and how fast is it?

The public API is small on purpose:

    vcbench.attention(q, k, v, method, tensor_layout="HND", backend="emulate", **options)
    vcbench.list_methods()

Everything else (generate, score, timeit, report) is reached through the `vcbench` CLI or the
submodules it calls.
"""

__version__ = "0.1.0"

from vcbench.kernels import attention, list_methods  # noqa: E402
from vcbench.pipelines.patch import patch  # noqa: E402

__all__ = ["attention", "list_methods", "patch", "__version__"]
