"""Checks for benchmarks/torchrun/torchrun_proof.sh (plain Python + stdlib: runs where only torch is).

Reads the distributed preflight files, a single-process run folder and a sharded run folder of
`vcbench generate`, and prints a PASS/FAIL table:
- preflight: every rank ran, with the expected backend (nccl on CUDA, gloo on CPU), on the GPU
  of its LOCAL_RANK (CUDA), and an all-reduce across ranks gave the right sum;
- each run folder holds every planned (method, prompt, seed) item exactly once (manifest rows
  and clip folders on disk), each row `ok`, its PNG frames hashing to the row's sha256;
- the sharded run's frames equal the single-process run's, item by item (sha256): required for
  bf16, required for the other methods only with --strict (reported either way);
- optionally, nvidia-smi samples taken during the sharded run show >= nproc GPUs busy.
Exit status 0 when every required check passes, 1 otherwise.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import sys
from pathlib import Path


def frames_sha256(directory: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(directory.glob("*.png")):
        h.update(path.read_bytes())
    return h.hexdigest()


def prompt_ids(path: Path) -> list[str]:
    ids = []
    for line in path.read_text().splitlines():
        if line.strip():
            ids.append(json.loads(line)["id"])
    return ids


def planned(methods: list[str], prompts: list[str], seeds: list[int]) -> list[str]:
    """generate's plan order (method-major); rank r makes items r, r+W, ..."""
    return [f"{m}/{p}/s{s}" for m in methods for p in prompts for s in seeds]


class Report:
    def __init__(self) -> None:
        self.rows: list[tuple[str, str, str]] = []

    def add(self, name: str, ok: bool | None, detail: str = "", required: bool = True) -> None:
        verdict = "SKIP" if ok is None else ("PASS" if ok else ("FAIL" if required else "DIFF"))
        self.rows.append((name, verdict, detail))

    @property
    def passed(self) -> bool:
        return all(v != "FAIL" for _, v, _ in self.rows)

    def print(self) -> None:
        width = max(len(n) for n, _, _ in self.rows)
        for name, verdict, detail in self.rows:
            print(f"  {name:<{width}}  {verdict:<4}  {detail}")


def check_preflight(report: Report, folder: Path, nproc: int, mode: str) -> None:
    infos = {}
    for path in sorted(folder.glob("preflight.rank*.json")):
        info = json.loads(path.read_text())
        infos[info["rank"]] = info
    report.add("preflight: every rank ran", sorted(infos) == list(range(nproc)),
               f"ranks {sorted(infos)} of world {nproc}")
    if not infos:
        return
    want = "nccl" if mode == "cuda" else "gloo"
    backends = [infos[r]["backend"] for r in sorted(infos)]
    report.add(f"preflight: backend {want} on every rank", all(b == want for b in backends), ",".join(backends))
    devices = [infos[r]["device"] for r in sorted(infos)]
    if mode == "cuda":
        own = all(i["device"] == f"cuda:{i['local_rank']}" and i["current_cuda"] == i["local_rank"]
                  for i in infos.values())
        report.add("preflight: rank uses the GPU of its LOCAL_RANK", own and len(set(devices)) == len(devices),
                   ",".join(devices) + " " + ",".join(str(infos[r].get("gpu_name")) for r in sorted(infos)))
    else:
        report.add("preflight: ranks on the CPU", all(d == "cpu" for d in devices), ",".join(devices))
    want_sum = nproc * (nproc + 1) / 2
    sums = [infos[r]["all_reduce"] for r in sorted(infos)]
    report.add("preflight: all_reduce across ranks", all(s == want_sum for s in sums),
               f"{sums} (want {want_sum:g})")


def read_run(report: Report, label: str, run: Path, items: list[str], world: int) -> dict[str, str]:
    """Checks one run folder; returns item -> sha256 of its frames (as re-hashed from disk)."""
    manifest_path = run / "manifest.json"
    if not manifest_path.is_file():
        report.add(f"{label}: manifest.json", False, f"missing in {run}")
        return {}
    manifest = json.loads(manifest_path.read_text())
    report.add(f"{label}: manifest status ok, world_size {world}",
               manifest.get("status") == "ok" and manifest.get("config", {}).get("world_size", 1) == world,
               f"status={manifest.get('status')} world_size={manifest.get('config', {}).get('world_size')}")
    listed = [row["item"] for row in manifest.get("items", [])]
    on_disk = sorted(str(p.parent.relative_to(run / "clips")) for p in (run / "clips").glob("*/*/s*/row.json"))
    once = sorted(listed) == sorted(items) and len(set(listed)) == len(listed) and on_disk == sorted(items)
    missing = sorted(set(items) - set(listed))
    extra = sorted(set(listed) - set(items)) + sorted(i for i in set(listed) if listed.count(i) > 1)
    report.add(f"{label}: every item exactly once ({len(items)})", once,
               f"rows={len(listed)} folders={len(on_disk)}" + (f" missing={missing}" if missing else "")
               + (f" extra/duplicate={extra}" if extra else ""))
    hashes, bad = {}, []
    for row in manifest.get("items", []):
        frames = run / row.get("frames_dir", "")
        digest = frames_sha256(frames) if row.get("status") == "ok" and frames.is_dir() else None
        if digest is None or digest != row.get("sha256"):
            bad.append(row["item"])
        if digest is not None:
            hashes[row["item"]] = digest
    report.add(f"{label}: rows ok, frames hash to the row's sha256", not bad and bool(hashes),
               f"bad={bad}" if bad else f"{len(hashes)} clips")
    return hashes


def check_gpus(report: Report, smi: Path | None, nproc: int) -> None:
    if smi is None or not smi.is_file() or not smi.read_text().strip():
        report.add("nvidia-smi: GPUs busy during sharded run", None, "no samples")
        return
    gpus, pids = set(), set()
    for fields in csv.reader(smi.read_text().splitlines()):
        if len(fields) >= 2 and fields[0].strip().isdigit():
            pids.add(fields[0].strip())
            gpus.add(fields[1].strip())
    report.add("nvidia-smi: GPUs busy during sharded run", len(gpus) >= nproc,
               f"{len(gpus)} GPU(s), {len(pids)} process(es)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, required=True, help="holds single/, sharded/, preflight.rank*.json")
    ap.add_argument("--methods", required=True)
    ap.add_argument("--prompts", type=Path, required=True, help="the JSONL prompts file both runs used")
    ap.add_argument("--seeds", required=True)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--mode", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--smi", type=Path, default=None, help="nvidia-smi compute-apps CSV sampled during the run")
    ap.add_argument("--strict", action="store_true", help="require equal frames for every method, not just bf16")
    args = ap.parse_args(argv)

    methods = [m for m in args.methods.split(",") if m]
    seeds = [int(s) for s in args.seeds.split(",") if s]
    items = planned(methods, prompt_ids(args.prompts), seeds)
    report = Report()
    check_preflight(report, args.work, args.nproc, args.mode)
    single = read_run(report, "single", args.work / "single", items, 1)
    sharded = read_run(report, "sharded", args.work / "sharded", items, args.nproc)
    check_gpus(report, args.smi, args.nproc)

    print(f"\nitems (plan order; sharded rank = index mod {args.nproc}):")
    print(f"  {'item':<28} {'rank':>4}  {'single':<12}  {'sharded':<12}  frames")
    for index, item in enumerate(items):
        a, b = single.get(item), sharded.get(item)
        same = "equal" if a and a == b else ("MISSING" if not (a and b) else "DIFFER")
        print(f"  {item:<28} {index % args.nproc:>4}  {(a or '-')[:12]:<12}  {(b or '-')[:12]:<12}  {same}")
    for method in methods:
        mine = [i for i in items if i.split("/")[0] == method]
        equal = [i for i in mine if single.get(i) and single.get(i) == sharded.get(i)]
        report.add(f"frames: {method} sharded == single ({len(mine)})", len(equal) == len(mine),
                   f"{len(equal)}/{len(mine)} equal", required=args.strict or method == "bf16")
    print("\nchecks:")
    report.print()
    print(f"\nOVERALL: {'PASS' if report.passed else 'FAIL'}")
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main())
