"""Shared fixtures: the pack root on sys.path and tiny checkpoints built once per session."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cosmos3_runtime.tiny import make_tiny_checkpoint  # noqa: E402


@pytest.fixture(scope="session")
def tiny_factory(tmp_path_factory):
    """Build (and cache) a tiny checkpoint for a given set of make_tiny_checkpoint options."""
    built = {}

    def build(**options):
        key = tuple(sorted(options.items()))
        if key not in built:
            name = "-".join(f"{k}={v}" for k, v in key) or "default"
            built[key] = make_tiny_checkpoint(tmp_path_factory.mktemp(name), **options)
        return built[key]

    return build


@pytest.fixture(scope="session")
def tiny_gated(tiny_factory):
    return tiny_factory(kind="gated")


@pytest.fixture(scope="session")
def tiny_edge(tiny_factory):
    return tiny_factory(kind="edge")
