"""`python -m vcbench.metrics psnr,ssim,lpips`: exit 0 if every named metric can be built in
this environment, else one `error:` line and exit 2. The Makefile's targets that generate and
then score ask first, so a missing package stops them before the clips, not after."""

from __future__ import annotations

import sys

from vcbench.errors import UserError
from vcbench.metrics import parse_metric_names


def main(argv: list[str]) -> int:
    try:
        parse_metric_names(",".join(argv))
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
