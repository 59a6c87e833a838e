"""One module per method; each declares a `METHOD`. The registry in vcbench.kernels lists them."""
