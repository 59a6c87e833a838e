"""The package version, in a module of its own so that anything can read it without importing
the package's API (vcbench/__init__.py imports most of vcbench)."""

__version__ = "0.1.0"
