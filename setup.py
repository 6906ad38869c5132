"""Build script beside pyproject.toml (which holds the metadata): the packages, and the run-time files that
live outside them in the checkout, as package data of the wheel --

* the bundled models: every ``models/<name>/`` holding a ``config.json``, its top-level files (no
  ``logs/``, no ``*.pt`` training state: the loaders read safetensors), as the data package
  ``clover_models`` (found by `clover_engine.checkpoint.bundled_models_dir`);
* the tutorials: ``notebooks/*.ipynb`` as ``clover_explorer/tutorials`` (``clover-explorer tutorials DIR``).

Setuptools has no declarative way to map a package onto another folder while still discovering the
others, hence this file. Tests: ``.venv/bin/python -m pytest tests/test_wheel.py -q -s``
"""

from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).resolve().parent
SKIPPED_SUFFIXES = {".pt"}  # a training run's resume state (train_state.pt): not needed to decode, and large


def model_files() -> list[str]:
    """The bundled models' files, relative to ``models/``."""
    return [f"{d.name}/{f.name}" for d in sorted((HERE / "models").iterdir()) if (d / "config.json").is_file()
            for f in sorted(d.iterdir()) if f.is_file() and f.suffix not in SKIPPED_SUFFIXES]


setup(
    packages=find_packages(where=str(HERE), include=["clover_engine", "clover_engine.*", "clover_kernels",
                                                     "clover_kernels.*", "clover_viz", "clover_viz.*",
                                                     "clover_explorer"])
    + ["clover_models", "clover_explorer.tutorials"],
    package_dir={"clover_models": "models", "clover_explorer.tutorials": "notebooks"},
    package_data={"clover_models": model_files(), "clover_explorer.tutorials": ["*.ipynb"]},
)
