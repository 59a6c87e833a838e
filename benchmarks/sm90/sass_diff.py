"""Whether two builds of the compiled sm_90a kernel hold the same machine code, instance by
instance: for each instance of vc_attention_kernel in both objects (or libraries), the SASS
from cuobjdump with only the function's name line dropped must match line for line (opcodes,
operands, order, addresses). A refactor of the sources that keeps every
instance identical needs no device round to show it changed nothing.

An instance is keyed by the bool template arguments of its mangled name (ExpCast, V-Smooth,
FP8 scores, V scale per tile; builds of older sources name only the first two, the others
false); --filter-a / --filter-b keep only the instances whose mangled name matches a regular
expression (an object of older sources holds other schedules too). With --ptxas-a / --ptxas-b
(the -Xptxas=-v output of each build) the register, spill and stack lines are compared as well.
Exit status 1 if anything differs or an instance is missing on either side.

Usage: python3 benchmarks/sm90/sass_diff.py A.o B.o [--filter-a RE] [--filter-b RE]
       [--ptxas-a A.log --ptxas-b B.log] [--cuobjdump PATH] [--show N]
"""

import argparse
import difflib
import re
import shutil
import subprocess
import sys

KERNEL = "vc_attention_kernel"
BOOLS = re.compile(r"Lb(\d)E")


FLAGS = ("expcast", "vsmooth", "qk_fp8", "v_per_tile")


def key(mangled: str) -> tuple[int, ...] | None:
    """(ExpCast, V-Smooth, FP8 scores, V per tile) of a kernel instance's mangled name (the
    last two 0 where the name has only two), or None for other functions."""
    at = mangled.find(KERNEL)
    if at < 0:
        return None
    flags = [int(f) for f in BOOLS.findall(mangled[at:])[:len(FLAGS)]]
    return tuple(flags + [0] * (len(FLAGS) - len(flags))) if len(flags) >= 2 else None


def named(k: tuple[int, ...]) -> str:
    return " ".join(f"{name}={flag}" for name, flag in zip(FLAGS, k, strict=True))


def instances(binary: str, cuobjdump: str, pattern: str | None) -> dict:
    """{key: (mangled name, SASS lines without the name line)} of the kernel instances."""
    sass = subprocess.run([cuobjdump, "-sass", binary], check=True, capture_output=True,
                          text=True).stdout
    out = {}
    for chunk in re.split(r"\n\s*Function : ", sass)[1:]:
        name, body = chunk.split("\n", 1)
        name = name.strip()
        k = key(name)
        if k is None or (pattern and not re.search(pattern, name)):
            continue
        if k in out:
            raise SystemExit(f"{binary}: two instances for {k}: {out[k][0]}, {name} (use --filter)")
        # a function's text ends where the next one's header or the ELF section listing starts
        lines = [ln.rstrip() for ln in body.split("\n")]
        while lines and not lines[-1].strip():
            lines.pop()
        out[k] = (name, [ln for ln in lines if not ln.lstrip().startswith(".")])
    return out


def ptxas_report(log: str) -> dict:
    """{key: [the ptxas -v lines of that instance: stack and spills, registers and barriers]}."""
    out, current = {}, None
    for line in open(log).read().splitlines():
        m = re.search(r"(?:Compiling entry function|Function properties for) '?(\w+)'?", line)
        if m:
            current = key(m.group(1)) if KERNEL in m.group(1) else None
            name = m.group(1)
            continue
        if current is not None and re.search(r"stack frame|spill|Used \d+ registers", line):
            out.setdefault((current, name), []).append(line.split("info    :")[-1].strip())
    return out


def by_key(report: dict, pattern: str | None) -> dict:
    kept = {}
    for (k, name), lines in report.items():
        if pattern and not re.search(pattern, name):
            continue
        kept.setdefault(k, []).extend(lines)
    return kept


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--filter-a")
    ap.add_argument("--filter-b")
    ap.add_argument("--ptxas-a")
    ap.add_argument("--ptxas-b")
    ap.add_argument("--cuobjdump", default=shutil.which("cuobjdump") or "cuobjdump")
    ap.add_argument("--show", type=int, default=20, help="diff lines to print per instance")
    args = ap.parse_args()
    a = instances(args.a, args.cuobjdump, args.filter_a)
    b = instances(args.b, args.cuobjdump, args.filter_b)
    ok = bool(a) and a.keys() == b.keys()
    if not a:
        print(f"no {KERNEL} instance in {args.a}")
    for k in sorted(a.keys() ^ b.keys()):
        print(f"{named(k)}: only in {args.a if k in a else args.b}")
    pa = pb = {}
    if args.ptxas_a and args.ptxas_b:
        pa = by_key(ptxas_report(args.ptxas_a), args.filter_a)
        pb = by_key(ptxas_report(args.ptxas_b), args.filter_b)
    for k in sorted(a.keys() & b.keys()):
        (na, la), (nb, lb) = a[k], b[k]
        same = la == lb
        line = f"{named(k)}: {len(la)} lines, " + (
            "SASS identical" if same else "SASS DIFFERS")
        if pa or pb:
            ra, rb = pa.get(k, []), pb.get(k, [])
            line += "; ptxas " + ("identical: " + "; ".join(ra) if ra == rb and ra
                                  else f"DIFFERS: {ra} vs {rb}")
            same &= ra == rb and bool(ra)
        print(line)
        print(f"   {na}\n   {nb}")
        if la != lb:
            diff = list(difflib.unified_diff(la, lb, lineterm="", n=1))
            print("\n".join("   " + d for d in diff[2:2 + args.show]))
        ok &= same
    print("identical" if ok else "NOT identical")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
