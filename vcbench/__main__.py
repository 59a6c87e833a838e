"""`python -m vcbench ...` (what `torchrun -m vcbench generate ...` runs)."""

from vcbench.cli import main

main()
