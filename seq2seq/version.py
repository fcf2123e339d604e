"""The package's version: one place, read by pyproject.toml, ``--version`` and run records."""

__version__ = "0.1.0"
