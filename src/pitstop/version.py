"""pitstop's version, in a module of its own so that any part (findings, cli) can read it without importing
the package's ``__init__``, which imports those parts."""

__version__ = "0.2.0"
