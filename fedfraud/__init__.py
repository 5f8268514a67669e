"""fedfraud: federated, privacy-preserving real-time card-fraud scoring.

The product packages live in the repository's top-level folders and install under this namespace
(``setup.py``): ``fedfraud.serving`` (``serving/``), ``fedfraud.training`` (``training/``),
``fedfraud.feature_store`` (``feature_store/``), the bottom-floor helpers ``fedfraud.core`` (``core/``) and the one
typed configuration that composes every layer's section, ``fedfraud.config`` (``config/``). The folder ``fedfraud/``
itself is the top floor, the glue a user touches: the CLI, the demo, the report, the console and the benchmarks.
Nothing below imports it (``tests/unit/test_import_layers.py``).
"""

from pathlib import Path

__version__ = "0.1.0"
__all__ = ["__version__"]

# A source checkout run without installing (a git worktree, `PYTHONPATH=.`, a Ray or Flower child process started
# from the repository) finds the mapped folders beside this one; an installed wheel has them inside it, which is
# searched first, so this changes nothing there.
_checkout = Path(__file__).resolve().parent.parent
if (_checkout / "setup.py").is_file() and all((_checkout / name / "__init__.py").is_file()
                                              for name in ("config", "training", "serving", "feature_store", "core")):
    __path__.append(str(_checkout))  # noqa: F821 - the package's own search path
