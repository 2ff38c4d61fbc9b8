"""sparse-dp: differentially private training of large embedding models that keeps
gradients sparse (DP-FEST, DP-AdaFEST, DP-AdaFEST+)."""

import pathlib

from setuptools import find_packages, setup

# The one stack on which TF Privacy, TFRS, dp_accounting and TF import together
# (../shared/NOTES.md §1): TF Privacy caps tensorflow<=2.15 and python<3.12.
INSTALL_REQUIRES = [
    "tensorflow==2.15.1",
    "tensorflow-privacy==0.9.0",
    "tensorflow-recommenders==0.7.7",
    "dp-accounting==0.4.3",
    "numpy==1.26.4",
    "scipy>=1.11,<2",
    "pandas>=2.1,<4",
    "matplotlib>=3.7,<4",
]

EXTRAS = {
    "test": ["pytest>=8,<10"],
}

setup(
    name="sparse-dp",
    version="0.1.0",
    description=__doc__.strip().splitlines()[0],
    long_description=pathlib.Path(__file__).with_name("README.md").read_text(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10,<3.12",
    # Top-level folders install under the sparse_dp namespace, never as
    # generic top-level names such as `data`.
    packages=find_packages(include=["sparse_dp", "sparse_dp.*"]) + ["sparse_dp.data",
                                                                    "sparse_dp.models"],
    package_dir={"sparse_dp.data": "data", "sparse_dp.models": "models"},
    install_requires=INSTALL_REQUIRES,
    extras_require=EXTRAS,
    entry_points={"console_scripts": ["sparse-dp = sparse_dp.cli:main"]},
)
