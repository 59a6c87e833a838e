"""vcbench: does a low-bit attention kernel keep a video DiT's output, and how fast is it?

The public API is small on purpose:

    vcbench.attention(q, k, v, method, tensor_layout="HND", backend="emulate", **options)
    vcbench.list_methods()

Everything else (generate, score, timeit, report) is reached through the `vcbench` CLI or the
submodules it calls.
"""

import os

__version__ = "0.1.0"

# OpenMP threads that spin while waiting (libgomp's default) collapse on a shared, busy CPU: each
# parallel region waits for a descheduled spinner. `vcbench score` on 2 cores at load ~6 ran 3x
# slower (LPIPS 2.1 s/frame vs 0.58). Passive waiting keeps the thread count, hence the same
# arithmetic and bit-identical scores. libgomp reads this once, when torch loads (the imports
# below), so it must come first; a value the user set wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from vcbench.kernels import attention, list_methods  # noqa: E402
from vcbench.pipelines.patch import patch  # noqa: E402

__all__ = ["attention", "list_methods", "patch", "__version__"]
