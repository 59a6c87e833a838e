"""Device check: what `vcbench timeit`'s preprocessing of a method is made of, kernel by
kernel (CUPTI ms a call, summed over each kernel's launches in a call), at the Wan2.2 shape
with Wan's RoPE as timeit prices it.

    PYTHONPATH=$PWD python3 benchmarks/checks/prep_kernels.py [--methods A,B] [--seconds W,S]
"""

from __future__ import annotations

import argparse

from vcbench.kernels import chosen
from vcbench.timing.cupti import time_kernels
from vcbench.timing.timeit import make_inputs, preprocessing


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--methods", default="sage3-4bit,vc-4bit,attnqat-tf,vc-8bit")
    ap.add_argument("--seconds", default="1,1")
    args = ap.parse_args()
    w, s = (float(t) for t in args.seconds.split(","))
    x = make_inputs("wan22-720p", None)
    for name in args.methods.split(","):
        impl = chosen(name, {}, tuple(x.q.shape))
        t = time_kernels(preprocessing(impl, x), w, s, min_calls=3)
        print(f"\n{name} ({impl.implementation}, rope {'fused' if impl.fuses_rope else 'eager'}): "
              f"{t.per_call_ms():.2f} ms a call")
        for kernel, times in sorted(t.by_kernel.items(), key=lambda kv: -sum(kv[1])):
            print(f"  {sum(times) / t.calls:8.3f} ms  x{len(times) / t.calls:4.1f}  {kernel[:110]}")


if __name__ == "__main__":
    main()
