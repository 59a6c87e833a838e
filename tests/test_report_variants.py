"""Method variants for kernel-error (`fp8-fa4+hadamard_qk`): parsing, validation, and that the
variant row really runs the rotation (its error differs from the plain method's)."""

from __future__ import annotations

import pytest
import torch

from vcbench.analysis.kernel_error import kernel_error_table, method_error
from vcbench.analysis.variants import parse_variant
from vcbench.config import load_experiment
from vcbench.errors import UserError


def test_parse_variant():
    assert parse_variant("fp8-fa4") == ("fp8-fa4", {})
    assert parse_variant("sage3-4bit+hadamard_qk") == ("sage3-4bit", {"hadamard_qk": True})
    with pytest.raises(UserError, match="no on/off option 'block_m'"):
        parse_variant("fp8-fa4+block_m")  # an option with values, not a switch
    assert parse_variant("sage2-8bit+hadamard_qk") == ("sage2-8bit", {"hadamard_qk": True})
    with pytest.raises(UserError, match="no on/off option 'hadamard_qk'"):
        parse_variant("attnqat-tf+hadamard_qk")
    with pytest.raises(UserError, match="unknown method"):
        parse_variant("fp9+hadamard_qk")


def test_variant_row_runs_the_rotation():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, 128, 64, generator=g) for _ in range(3))
    q[..., 3] += 20.0  # a channel outlier: what a QK Hadamard spreads out
    table = kernel_error_table(q, k, v, ["fp8-fa4", "fp8-fa4+hadamard_qk"])
    assert list(table.method) == ["fp8-fa4", "fp8-fa4+hadamard_qk"]
    rotated = method_error(q, k, v, "fp8-fa4", hadamard_qk=True)
    assert table.rel_l2.iloc[1] == pytest.approx(rotated["rel_l2"], rel=1e-12)
    assert table.rel_l2.iloc[1] != pytest.approx(table.rel_l2.iloc[0], rel=1e-3)


def test_experiment_files_validate_variants(tmp_path):
    fig3 = load_experiment("experiments/fig3.yaml")
    assert "fp8-fa4+hadamard_qk" in fig3["methods"]
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ncommand: analyze\nanalysis: kernel-error\nmethods: [fp8-fa4+nope]\n")
    with pytest.raises(UserError, match="key 'methods'.*no on/off option 'nope'"):
        load_experiment(bad)
    for name in ("table1", "fig4", "fig5", "demo-kernel-error", "demo-token-order"):
        load_experiment(f"experiments/{name}.yaml")
