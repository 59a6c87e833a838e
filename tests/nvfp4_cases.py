"""The cases tests/test_nvfp4_interpreter.py runs (importable without Triton: its driver,
nvfp4_interpreter_driver.py, sets TRITON_INTERPRET, which must not leak into the test process)."""

CASES = [  # (method, options, B, H, N, D, layout, inputs): "nhd" inputs are strided views of
    # (B, N, H, D) memory; "extreme" inputs carry zero blocks, saturating and subnormal scales
    ("sage3-4bit", {}, 1, 2, 257, 64, "hnd", "bf16"),
    ("sage3-4bit", {"hadamard_qk": True}, 1, 2, 300, 128, "hnd", "bf16"),
    ("sage3-4bit", {"block_m": 64, "block_n": 64}, 2, 1, 200, 128, "nhd", "bf16"),
    ("sage3-4bit", {}, 2, 2, 37, 64, "hnd", "extreme fp16"),
    ("vc-4bit", {}, 2, 1, 300, 64, "nhd", "bf16"),
    ("vc-4bit", {"hadamard_qk": False}, 1, 2, 257, 128, "hnd", "bf16"),
    ("vc-4bit", {}, 1, 2, 256, 128, "hnd", "extreme bf16"),
    ("attnqat-tf", {}, 1, 2, 300, 64, "hnd", "bf16"),
    ("attnqat-tf", {}, 2, 1, 257, 128, "nhd", "bf16"),
    ("attnqat-tf", {}, 1, 1, 130, 64, "hnd", "extreme fp16"),
]


def case_name(case):
    method, opts, b, h, n, d, layout, kind = case
    extra = ",".join(f"{k}={v}" for k, v in opts.items())
    return f"{method}[{extra}] B{b}H{h}N{n}D{d} {layout} {kind}"

# A non-finite value in (batch 1, head 0) of one operand: (method, options, B, H, N, D).
POISON_CASES = [
    ("sage3-4bit", {}, 2, 2, 150, 64),
    ("vc-4bit", {}, 2, 2, 150, 64),
    ("attnqat-tf", {}, 2, 2, 150, 64),
]
POISON_VALUES = {"nan": float("nan"), "+inf": float("inf"), "-inf": -float("inf")}


def poison_name(case, operand, bad):
    method, opts, b, h, n, d = case
    return f"{method} B{b}H{h}N{n}D{d} {bad} in {operand}"
