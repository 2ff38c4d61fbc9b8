"""sparse-dp: differentially private training of large embedding models that keeps
gradients sparse (DP-FEST, DP-AdaFEST, DP-AdaFEST+)."""

import pathlib

from setuptools import find_packages, setup

# Two pinned stacks, chosen by the Python version (docs/getting-started.md):
# * Python 3.10-3.11: TF 2.15.1 with TF Privacy 0.9.0 (the DP-SGD baseline and
#   the equivalence tests). TF Privacy 0.9.0 caps tensorflow<=2.15 and python<3.12,
#   so this stack ends at Python 3.11.
# * Python 3.12-3.13: TF 2.21.0, where tf.keras is Keras 3, with Keras 2 from
#   tf-keras 2.21.0 (TFRS and sparse_dp need Keras 2) and no TF Privacy (it
#   does not import on TF 2.16+).
_TF215 = "python_version < '3.12'"
_TF221 = "python_version >= '3.12'"
INSTALL_REQUIRES = [
    f"tensorflow==2.15.1; {_TF215}",
    f"tensorflow-privacy==0.9.0; {_TF215}",
    f"dp-accounting==0.4.3; {_TF215}",
    f"numpy==1.26.4; {_TF215}",
    f"tensorflow==2.21.0; {_TF221}",
    f"tf-keras==2.21.0; {_TF221}",
    f"dp-accounting==0.6.0; {_TF221}",
    f"numpy==2.4.4; {_TF221}",
    "tensorflow-recommenders==0.7.7",
    # `sparse-dp sample` (Poisson sampling on Beam). 2.77.0 (the newest) takes
    # protobuf >=3.20.3,<7: on 3.11 it resolves with TF 2.15.1's protobuf<5
    # (4.25.x; proto-plus 1.28), on 3.12+ TF 2.21 gets protobuf 6.33 (not 7).
    "apache-beam==2.77.0",
    "scipy>=1.11,<2",
    "pandas>=2.1,<4",
    "matplotlib>=3.7,<4",
    "pyyaml>=6,<7",  # `sparse-dp study --grid FILE`
]

EXTRAS = {
    "test": ["pytest>=8,<10", "ruff==0.17.6",  # `ruff check .`, run by .ci/run
             "pytest-xdist==3.8.0",  # `pytest -n auto`: the fast tier on every core
             "nbclient==0.11.0", "ipykernel==7.4.0", "jupytext==1.19.6",
             # the manual (docs/, mkdocs.yml), built with --strict: tests/architecture/test_docs.py
             "mkdocs==1.6.1", "mkdocs-material==9.8.1", "mkdocstrings[python]==1.0.8",
             "mkdocstrings-python==2.0.11"],
}

setup(
    name="sparse-dp",
    version="0.1.0",
    description=__doc__.strip().splitlines()[0],
    long_description=pathlib.Path(__file__).with_name("README.md").read_text(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10,<3.14",
    # Top-level folders install under the sparse_dp namespace, never as
    # generic top-level names such as `data`.
    packages=find_packages(include=["sparse_dp", "sparse_dp.*"]) + ["sparse_dp.data",
                                                                    "sparse_dp.models"],
    package_dir={"sparse_dp.data": "data", "sparse_dp.models": "models"},
    install_requires=INSTALL_REQUIRES,
    extras_require=EXTRAS,
    entry_points={"console_scripts": ["sparse-dp = sparse_dp.cli:main"]},
)
