"""Only what pyproject.toml cannot say: the packages are found (every worker.* package, so none is
left out of the wheel), plus sql/, which ships as worker.sql (see package-dir there)."""

from setuptools import find_namespace_packages, setup

# Namespace packages: data directories (the console's templates, wherever they live) count too,
# so setuptools ships them without warning that an importable directory was left out; likewise
# sql/migrations and sql/queries under their mapped names.
setup(
    packages=[
        *find_namespace_packages(include=["worker", "worker.*"], exclude=["*.__pycache__"]),
        "worker.sql",
        "worker.sql.migrations",
        "worker.sql.queries",
    ]
)
