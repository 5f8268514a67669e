"""Package map: the product's top-level folders install under the ``fedfraud`` namespace.

``config/``, ``training/``, ``serving/``, ``feature_store/`` and ``core/`` stay at the top of the repository (one
folder per concern, as a newcomer expects) but install as ``fedfraud.config``, ``fedfraud.training``,
``fedfraud.serving``, ``fedfraud.feature_store`` and ``fedfraud.core``, so
``pip install fedfraud`` puts nothing generic into site-packages. Everything else is in pyproject.toml.
"""

from setuptools import find_packages, setup

MAPPED = ("config", "training", "serving", "feature_store", "core")

packages = find_packages(include=["fedfraud", "fedfraud.*"])
package_dir = {"fedfraud": "fedfraud"}
for top in MAPPED:
    packages += [f"fedfraud.{name}" for name in find_packages(include=[top, f"{top}.*"])]
    package_dir[f"fedfraud.{top}"] = top

setup(packages=packages, package_dir=package_dir)
