"""GPU kernels written in Triton, one file per kernel family (sm_90 first).

Importing this package needs Triton and a CUDA device; `vcbench.kernels.gpu` checks for both
before it imports anything here, so CPU machines never touch it.
"""
