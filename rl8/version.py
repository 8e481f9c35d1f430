"""rl8's version (a bottom module: rl8's modules read it from here, not from ``rl8``)."""

__version__ = "2.0.0.dev0"
