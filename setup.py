"""Install the repository's four folders under one distinctive import name, ``adaptive_decoding``.

``framework/`` becomes ``adaptive_decoding.framework`` (and so on for ``controllers/``, ``scorers/``,
``experiments/``), so a researcher's own ``experiments`` or ``framework`` package in their project
never shadows this one, nor this one theirs. The package list is found by scanning the folders; every
other setting lives in pyproject.toml.
"""
from setuptools import find_packages, setup

NAMESPACE = "adaptive_decoding"
FOLDERS = ("framework", "controllers", "scorers", "experiments")
NOT_INSTALLED = ["experiments.studies", "experiments.studies.*"]  # one-off studies: run from a checkout

setup(
    packages=[f"{NAMESPACE}.{name}" for name in
              find_packages(include=[f"{f}*" for f in FOLDERS], exclude=NOT_INSTALLED)],
    package_dir={f"{NAMESPACE}.{f}": f for f in FOLDERS},
    package_data={f"{NAMESPACE}.experiments": ["configs/*.yaml"],
                  f"{NAMESPACE}.framework": ["models/weights/*/*", "learning/policies/*"]},
)
