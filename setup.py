"""Map the top-level folders to the `pagoda.*` packages.

The folders are named for what they hold (runtime/, kernels/, operator/) while
the import names live under `pagoda.`, so `operator/` never shadows the stdlib.
"""

from setuptools import find_packages, setup

ROOTS = {
    "pagoda": "_pagoda",
    "pagoda.runtime": "runtime",
    "pagoda.kernels": "kernels",
    "pagoda.operator": "operator",
}

packages: list[str] = []
for name, folder in ROOTS.items():
    packages.append(name)
    packages += [f"{name}.{sub}" for sub in find_packages(folder)]

setup(
    packages=packages,
    package_dir=ROOTS,
    package_data={
        "pagoda.operator": ["*.yaml", "**/*.yaml"],
        "pagoda.kernels.cpu": ["*.cpp", "*.h"],
    },
    include_package_data=True,
)
