"""The package's version: `rocm_safe.__version__` is the installed wheel's
(both come from python/Cargo.toml), and the CHANGELOG has its release
section."""

import importlib.metadata
import re
from pathlib import Path

import pytest

import rocm_safe


def test_version_is_the_wheels():
    try:
        installed = importlib.metadata.version("rocm-safe")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("rocm_safe is not installed as a distribution")
    assert rocm_safe.__version__ == installed
    assert re.fullmatch(r"\d+\.\d+\.\d+([.-]?\w+)*", rocm_safe.__version__), rocm_safe.__version__


def test_the_changelog_has_a_section_for_this_release():
    changelog = Path(__file__).resolve().parents[2] / "CHANGELOG.md"
    cargo = Path(__file__).resolve().parents[1] / "Cargo.toml"
    if not changelog.is_file() or not cargo.is_file():
        pytest.skip("not a repository checkout")
    version = re.search(r'^version = "([^"]+)"', cargo.read_text(), re.M).group(1)
    assert re.search(rf"^## {re.escape(version)} \(", changelog.read_text(), re.M), version
