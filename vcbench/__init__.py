"""vcbench: does a low-bit attention kernel keep a video DiT's output, and how fast is it?

The public API is small on purpose:

    vcbench.attention(q, k, v, method, tensor_layout="HND", backend="emulate", **options)
    vcbench.list_methods()
    vcbench.patch(pipe, method, **options)          # a pipeline's attention through a method
    vcbench.register(entry)                         # a method, kernel, backend, model or metric
    vcbench.register_kernel(name, fn, **fields)     # a callable as a method (docs/extending.md)

Everything else (generate, score, timeit, report) is reached through the `vcbench` CLI or the
submodules it calls.
"""

import os

from vcbench.version import __version__

# OpenMP threads that spin while waiting (libgomp's default) collapse on a shared, busy CPU: each
# parallel region waits for a descheduled spinner. `vcbench score` on 2 cores at load ~6 ran 3x
# slower (LPIPS 2.1 s/frame vs 0.58). Passive waiting keeps the thread count, hence the same
# arithmetic and bit-identical scores. libgomp reads this once, when torch loads (the imports
# below), so it must come first; a value the user set wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from vcbench import plugins  # noqa: E402, F401  (entry points load before the first lookup)
from vcbench.kernels import attention, list_methods, register_kernel  # noqa: E402
from vcbench.pipelines.patch import patch  # noqa: E402


def register(entry):
    """Add `entry` to the registry of its kind: a `Method` or `KernelMethod`
    (vcbench.kernels.spec.method), a `Backend` (vcbench.kernels.backends.common), a
    `ModelEntry` (vcbench.pipelines.registry) or a `MetricEntry` (vcbench.metrics). Returns it;
    a name already taken is a UserError."""
    from vcbench.errors import UserError
    from vcbench.plugins import registries

    for registry, kinds in _entry_kinds(registries()):
        if isinstance(entry, kinds):
            return registry.register(entry)
    raise UserError(f"vcbench.register: {type(entry).__name__} is not a method, kernel, backend, "
                    "model or metric entry")


def _entry_kinds(groups):
    from vcbench.kernels.backends.common import Backend
    from vcbench.kernels.spec.method import KernelMethod, Method
    from vcbench.metrics import MetricEntry
    from vcbench.pipelines.registry import ModelEntry

    kinds = {"vcbench.methods": (Method, KernelMethod), "vcbench.backends": (Backend,),
             "vcbench.models": (ModelEntry,), "vcbench.metrics": (MetricEntry,)}
    return [(groups[g], k) for g, k in kinds.items()]


__all__ = ["attention", "list_methods", "patch", "register", "register_kernel", "__version__"]
