"""fedfraud: federated, privacy-preserving real-time card-fraud scoring.

The product packages live in the repository's top-level folders and install under this namespace
(``setup.py``): ``fedfraud.feature_store`` (``feature_store/``), ``fedfraud.training`` (``training/``) and
``fedfraud.serving`` (``serving/``). The folder ``fedfraud/`` itself holds the glue a user touches: the CLI, the
typed configuration, the benchmarks and the bottom-layer helpers.
"""

from pathlib import Path

__version__ = "0.1.0"
__all__ = ["__version__"]

# A source checkout run without installing (a git worktree, `PYTHONPATH=.`, a Ray or Flower child process started
# from the repository) finds the mapped folders beside this one; an installed wheel has them inside it, which is
# searched first, so this changes nothing there.
_checkout = Path(__file__).resolve().parent.parent
if (_checkout / "setup.py").is_file() and all((_checkout / name / "__init__.py").is_file()
                                              for name in ("training", "serving", "feature_store")):
    __path__.append(str(_checkout))  # noqa: F821 - the package's own search path
