"""Timing on the GPU: CUPTI activity records (through torch.profiler's Kineto) -> per-launch
medians, and the `timeit` command built on them."""
