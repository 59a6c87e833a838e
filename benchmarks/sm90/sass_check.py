"""SASS facts of the compiled sm_90a kernel, per template instance: the matrix instructions
(IGMMA for the INT8 QK wgmma, or QGMMA from shared memory for the FP8 one; QGMMA with P from
registers for the FP8 PV wgmma, HGMMA for V-Smooth's mean product), local memory (LDL/STL),
I2FP (the INT8 scores' convert, which FP8 scores do without), and MUFU.EX2, which ExpCast must
keep off the P path (only the per-row alpha and the per-16-tile mean weights may use it). Exit
status 1 if a check fails.

Usage: python3 benchmarks/sm90/sass_check.py LIBRARY_OR_CUBIN [--cuobjdump PATH]
(the library: `python3 -c 'from vcbench.kernels.backends.sm90 import compiled; print(compiled.library_path())'`)
"""

import argparse
import re
import shutil
import subprocess
import sys
from collections import Counter

# the kernel's instance as mangled: its template arguments ExpCast, V-Smooth and, in builds
# that have them, FP8 scores and a V scale per tile
INSTANCE = re.compile(r"vc_attention_kernelI(?:NS_\w+I)?Lb(\d)ELb(\d)E(?:Lb(\d)ELb(\d)E)?E")
# QK from shared memory (A is a descriptor) against PV (A from registers)
QGMMA_SS = re.compile(r"QGMMA\.\w+\.F32\.E4M3\.E4M3 R\d+, gdesc")
QGMMA_RS = re.compile(r"QGMMA\.\w+\.F32\.E4M3\.E4M3 R\d+, R\d+, gdesc")
OPCODE = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*(?:\.[A-Za-z0-9_]+)*)")


def functions(sass: str):
    """(mangled name, opcodes, SASS text) of each function."""
    for chunk in re.split(r"\n\s*Function : ", sass)[1:]:
        name = chunk.split("\n", 1)[0].strip()
        yield name, [m.group(1) for m in OPCODE.finditer(chunk)], chunk


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("binary")
    ap.add_argument("--cuobjdump", default=shutil.which("cuobjdump") or "cuobjdump")
    args = ap.parse_args()
    sass = subprocess.run([args.cuobjdump, "-sass", args.binary], check=True, capture_output=True,
                          text=True).stdout
    ok = True
    instances = 0
    print(f"{'instance':20s} {'instr':>6s} {'IGMMA':>5s} {'QGMMA':>5s} {'DEPBAR':>6s} {'HGMMA':>5s} "
          f"{'LDL/STL':>7s} {'MUFU.EX2':>8s} {'I2FP':>5s} {'I2F':>4s} {'FMNMX':>5s}  check")
    for name, ops, chunk in functions(sass):
        m = INSTANCE.search(name)
        if not m:
            continue
        instances += 1
        expcast, vsmooth, fp8, v_tile = (int(x or 0) for x in m.groups())
        base = Counter(op.split(".")[0] for op in ops)
        full = Counter(ops)
        ex2 = sum(v for k, v in full.items() if k.startswith("MUFU.EX2"))
        local = base["LDL"] + base["STL"]
        gmma = base["IGMMA"] + base["QGMMA"] + base["HGMMA"]
        depbar = sum(v for k, v in full.items() if k.startswith("WARPGROUP.DEPBAR"))
        # ExpCast: alpha (2 rows) per softmax copy; with V-Smooth the softmax is in four copies
        # (first batch, a batch's first tile, the rest, the last tile: 8 alphas) and the
        # weights in three places (the batch tile, the two batches after the loop: 24).
        ex2_allowed = (8 + (32 if vsmooth else 0)) if expcast else None
        problems = []
        if fp8:  # QK on the FP8 tensor core, no INT8 product, no convert per score
            if base["IGMMA"] or not QGMMA_SS.search(chunk):
                problems.append("QK not by QGMMA from shared memory")
            if base["I2FP"] > 16:
                problems.append(f"I2FP {base['I2FP']}: scores converted?")
        elif not base["IGMMA"]:
            problems.append("no IGMMA")
        if not QGMMA_RS.search(chunk):
            problems.append("no PV QGMMA")
        if vsmooth and not base["HGMMA"]:  # the mean product
            problems.append("no HGMMA")
        if local:
            problems.append("local memory")
        if depbar >= gmma:  # ptxas waits after every wgmma when it serializes them (C7511)
            problems.append("wgmma serialized")
        if ex2_allowed is not None and ex2 > ex2_allowed:
            problems.append(f"MUFU.EX2 {ex2} > {ex2_allowed}: on the P path?")
        ok &= not problems
        label = (f"{'expcast' if expcast else 'exp2'}{' vsmooth' if vsmooth else ''}"
                 f"{' fp8qk' if fp8 else ''}{' vtile' if v_tile else ''}")
        print(f"{label:20s} {len(ops):6d} {base['IGMMA']:5d} {base['QGMMA']:5d} {depbar:6d} "
              f"{base['HGMMA']:5d} {local:7d} {ex2:8d} {base['I2FP']:5d} {base['I2F']:4d} {base['FMNMX']:5d}  "
              f"{'ok' if not problems else '; '.join(problems)}")
    names = sorted({op for _, ops, _ in functions(sass) for op in ops if "GMMA" in op})
    print("matrix instructions as printed:", ", ".join(names))
    if not instances:
        print("no kernel instance with the current template parameters found")
        ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
