"""fedfraud: federated, privacy-preserving real-time card-fraud scoring.

The ``fedfraud`` package holds only the glue a user touches: the CLI, the
typed configuration and the benchmarks. The product itself lives in the
top-level packages ``feature_store``, ``training`` and ``serving``.
"""

__version__ = "0.1.0"
__all__ = ["__version__"]
