"""The package's version, in one place: ``gae_xp.__version__`` and the wheel's metadata (pyproject.toml's
``[tool.setuptools.dynamic]``, which reads this file without importing the package) both take it from here."""

__version__ = "0.1.0"
