"""Figure 7's ladder (vcbench/analysis/fusion.py) times one computation: every rung's
operands equal the final kernels', checked on a small shape under Triton's CPU interpreter
(INT8 Q/K codes and every scale and mean bit for bit across all rungs; E4M3 V codes between
the Triton rungs, since the interpreter's FP8 cast is not the GPU's, see
test_triton_interpreted.py). And on a CPU the command and `make fig7` refuse in one line."""

import os
import subprocess
import sys

import pytest

pytest.importorskip("triton", reason="Triton is not installed")

from interpreted import INTERPRETED, ROOT, rerun_interpreted  # noqa: E402

if not INTERPRETED:
    def test_rungs_under_the_interpreter():
        rerun_interpreted(__file__, timeout=900)

    def test_the_cli_needs_a_gpu():
        import torch

        if torch.cuda.is_available():
            pytest.skip("this machine has a GPU")
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        proc = subprocess.run([sys.executable, "-m", "vcbench", "analyze", "fusion"], cwd=ROOT,
                              env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 2
        assert proc.stderr.strip().splitlines() == [
            "error: analyze fusion needs a CUDA GPU (it times kernels with CUPTI); this machine has none"]
        make = subprocess.run(["make", "fig7", "ENV=system", f"PY={sys.executable}"], cwd=ROOT,
                              env=env, capture_output=True, text=True, timeout=300)
        assert make.returncode == 2 and "make fig7 needs a CUDA GPU" in make.stderr
        assert len(make.stderr.strip().splitlines()) <= 2  # the line, and make's own

else:
    import torch

    from vcbench.analysis import fusion

    def test_every_rung_makes_the_final_kernels_operands():
        x = fusion.call_inputs((1, 2, 200, 64), "cpu", seed=3)
        x.k[..., 5] += 6  # a channel outlier the rotation and K's mean act on
        p = fusion.plan()
        assert p.hadamard_qk and p.vsmooth is not None
        perm = fusion._torch_group(x.v, p)
        runs = {name: fusion.LADDER[name][1](x, p, perm)
                for name in fusion.LADDER if fusion.LADDER[name] is not None}
        final = runs.pop("final")
        for name, ops in runs.items():
            for key in ("q", "q_scale", "k", "k_scale", "v_scale", "v_mean"):
                assert torch.equal(ops[key].float(), final[key].float()), (name, key)
        assert torch.equal(runs["quantizers"]["v"].float(), final["v"].float())
