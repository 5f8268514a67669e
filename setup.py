"""Package map: the product's top-level folders install under the ``fedfraud`` namespace.

``training/``, ``serving/`` and ``feature_store/`` stay at the top of the repository (one folder per concern, as a
newcomer expects) but install as ``fedfraud.training``, ``fedfraud.serving`` and ``fedfraud.feature_store``, so
``pip install fedfraud`` puts nothing generic into site-packages. Everything else is in pyproject.toml.
"""

from setuptools import find_packages, setup

MAPPED = ("training", "serving", "feature_store")

packages = find_packages(include=["fedfraud", "fedfraud.*"])
package_dir = {"fedfraud": "fedfraud"}
for top in MAPPED:
    packages += [f"fedfraud.{name}" for name in find_packages(include=[top, f"{top}.*"])]
    package_dir[f"fedfraud.{top}"] = top

setup(packages=packages, package_dir=package_dir)
