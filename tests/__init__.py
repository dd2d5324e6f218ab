"""The test suite, imported one way only: as the package ``tests`` (``from tests.references.margin import ...``), never
as top-level modules; no test module imports another (tests/test_architecture.py checks both)."""
