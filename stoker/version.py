"""stoker's version: the single source (pyproject.toml reads it; `stoker --version`,
the frozen config and the sbatch header print it). A leaf, so that code below the
package's face can name the version without importing `stoker/__init__.py`."""

__version__ = "0.1.0"
