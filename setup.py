"""Maps the top-level subsystem folders onto the `wpk` package (see DESIGN.md, Layout).

`dsl/` becomes `wpk.dsl`, `kernels/` becomes `wpk.kernels` and so on, with their
subpackages; everything else lives in pyproject.toml.
"""

from setuptools import find_packages, setup

SUBSYSTEMS = {"wpk": "wpk", "wpk.dsl": "dsl", "wpk.kernels": "kernels",
              "wpk.search": "search", "wpk.plans": "plans"}


def _packages_and_dirs():
    packages, package_dir = [], {}
    for package, folder in SUBSYSTEMS.items():
        package_dir[package] = folder
        packages.append(package)
        for sub in find_packages(folder):
            packages.append(f"{package}.{sub}")
            package_dir[f"{package}.{sub}"] = f"{folder}/{sub.replace('.', '/')}"
    return packages, package_dir


PACKAGES, PACKAGE_DIR = _packages_and_dirs()
setup(packages=PACKAGES, package_dir=PACKAGE_DIR)
