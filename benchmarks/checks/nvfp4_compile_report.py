"""What ptxas makes of the NVFP4 kernels, per method variant, as a launch at the Wan2.2 shape
builds them (D = 128, the methods' default tiles): registers, stack frame, local memory, and
the SASS instructions of the attention kernel's KV-tile loop (per warp and tile), by opcode.
No GPU needed (Triton compiles for sm_90 anywhere); on the device it reports that machine's
Triton. Compiled, not timed.

    PYTHONPATH=$PWD:$PWD/tests python3 benchmarks/checks/nvfp4_compile_report.py
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))

from test_nvfp4_compile import PREPROCESSING, VARIANTS, compile_for_sm90, cuobjdump, resources  # noqa: E402

from vcbench.kernels import get_method  # noqa: E402
from vcbench.kernels.backends.triton import nvfp4, nvfp4_attention  # noqa: E402

LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?);")


def tile_loop(sass: str) -> Counter:
    """Opcodes of the longest backward branch's body that holds the HGMMAs: the KV-tile loop."""
    ins = [(int(a, 16), t.strip()) for a, t in LINE.findall(sass)]
    best = None
    for addr, text in ins:
        m = re.search(r"\bBRA\b.*?(0x[0-9a-f]+)", text)
        if m and int(m.group(1), 16) < addr:
            lo = int(m.group(1), 16)
            body = [t for a, t in ins if lo <= a <= addr]
            if any("HGMMA" in t for t in body) and (best is None or len(body) > len(best)):
                best = body
    return Counter(re.sub(r"^@!?U?P\w+\s+", "", t).split()[0].split(".")[0] for t in best or [])


def main() -> int:
    tmp = Path(tempfile.mkdtemp())
    print(f"{'kernel':24s} {'regs':>4s} {'stack':>5s} {'local':>5s} {'LDL/STL':>7s} "
          f"{'loop instr':>10s}  top opcodes of the loop")
    for name, (method, opts) in VARIANTS.items():
        plan = get_method(method).plan(opts)
        compiled = compile_for_sm90(
            nvfp4_attention._nvfp4_attention_fwd,
            {**nvfp4_attention.switches(plan), "BLOCK_M": plan.block_m, "BLOCK_N": plan.block_n,
             "D": 128}, num_warps=nvfp4_attention.NUM_WARPS, num_stages=nvfp4_attention.NUM_STAGES)
        used = resources(compiled, tmp)
        (tmp / "kernel.cubin").write_bytes(compiled.asm["cubin"])
        sass = subprocess.run([cuobjdump(), "-sass", str(tmp / "kernel.cubin")], check=True,
                              capture_output=True, text=True).stdout
        loop = tile_loop(sass)
        top = " ".join(f"{k} {v}" for k, v in loop.most_common(8))
        print(f"{'attention ' + name:24s} {used['REG']:4d} {used['STACK']:5d} {used['LOCAL']:5d} "
              f"{used['LDL/STL']:7d} {sum(loop.values()):10d}  {top}", flush=True)
    for label, (kernel, constexprs) in PREPROCESSING.items():
        warps = {"_quantize_qk": nvfp4.QK_WARPS, "_quantize_v": nvfp4.V_WARPS}
        compiled = compile_for_sm90(getattr(nvfp4, kernel), {**constexprs, "D": 128},
                                    num_warps=warps.get(kernel, nvfp4.NUM_WARPS),
                                    enable_fp_fusion=False)
        used = resources(compiled, tmp)
        print(f"{label:24s} {used['REG']:4d} {used['STACK']:5d} {used['LOCAL']:5d} "
              f"{used['LDL/STL']:7d}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
