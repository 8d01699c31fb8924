"""Tests use the package's sandbox: an isolated pipeline per test (see streams/sandbox.py)."""

from streams.sandbox import Pipeline, free_port, isolated_pipeline

__all__ = ["Pipeline", "free_port", "isolated_pipeline"]
