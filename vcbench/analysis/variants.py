"""Method variants for the kernel-error analysis: `METHOD+OPTION[+OPTION...]`.

    fp8-fa4+hadamard_qk      fp8-fa4 with its QK Hadamard on (paper Fig. 3a, Table 2 "+Hadamard")
    sage3-4bit+hadamard_qk

Each `+OPTION` turns one of the method's boolean options on, so one kernel-error run can hold
a method with and without a rotation, each as its own row named by the variant. Options with
values go in `--option METHOD.KEY=VALUE` / `method_options:` as before, keyed by the variant.
"""

from __future__ import annotations

from typing import Any

from vcbench.errors import UserError


def parse_variant(name: str) -> tuple[str, dict[str, Any]]:
    """'fp8-fa4+hadamard_qk' -> ('fp8-fa4', {'hadamard_qk': True}); a plain name has no flags."""
    from vcbench.kernels import get_method

    base, *flags = name.split("+")
    method = get_method(base)  # unknown base: the registry's one-line error
    declared = method.all_options()
    options: dict[str, Any] = {}
    for flag in flags:
        option = declared.get(flag)
        if option is None or not isinstance(option.default, bool):
            switches = sorted(k for k, o in declared.items() if isinstance(o.default, bool))
            raise UserError(f"variant {name!r}: {base} has no on/off option {flag!r} "
                            f"(its on/off options: {', '.join(switches) or 'none'})")
        if flag in options:
            raise UserError(f"variant {name!r} names {flag!r} twice")
        options[flag] = True
    return base, options
