"""`vcbench report`: join run folders into report.md, CSV tables and PNG figures.

load.py reads and checks the runs, tables.py builds the tables (mean, 95% CI, n), figures.py
draws them, assemble.py writes the report folder.
"""

from vcbench.report.assemble import Report, build_report

__all__ = ["Report", "build_report"]
