"""The cases tests/test_nvfp4_interpreter.py runs (importable without Triton: its driver,
nvfp4_interpreter_driver.py, sets TRITON_INTERPRET, which must not leak into the test process)."""

CASES = [  # (method, options, B, H, N, D, NHD): NHD inputs are strided views of (B, N, H, D)
    ("sage3-4bit", {}, 1, 2, 257, 64, False),
    ("sage3-4bit", {"hadamard_qk": True}, 1, 2, 300, 128, False),
    ("sage3-4bit", {"block_m": 64, "block_n": 64}, 2, 1, 200, 128, True),
    ("vc-4bit", {}, 2, 1, 300, 64, True),
    ("vc-4bit", {"hadamard_qk": True}, 1, 2, 257, 128, False),
    ("attnqat-tf", {}, 1, 2, 300, 64, False),
    ("attnqat-tf", {}, 2, 1, 257, 128, True),
]


def case_name(case):
    method, opts, b, h, n, d, nhd = case
    extra = ",".join(f"{k}={v}" for k, v in opts.items())
    return f"{method}[{extra}] B{b}H{h}N{n}D{d}" + (" NHD" if nhd else "")
