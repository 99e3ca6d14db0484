"""A pytest plugin for running the safetensors project's own tests against
rocm_safe through the shim package next to it (``safetensors/``):
``-p rocm_safe_upstream`` with this folder first on ``PYTHONPATH``
(``run-upstream-suite.sh`` does both).

- It refuses to run unless ``import safetensors`` is the shim and the shim
  serves rocm_safe (else the suite would test the real package).
- Every test listed in ``expected-failures.txt`` is marked
  ``xfail(strict=True, raises=AssertionError)``: a listed test that passes
  fails the run, and so does one that fails otherwise than on an assertion
  of the suite, or any failure of a test not listed.
- Each entry's reason must appear word for word in python/README.md's
  "What differs from `safetensors`" section; an entry whose test was not
  collected, or did not run to its expected failure (skipped, say), fails
  the run.
"""

from __future__ import annotations

import os
import re
from typing import Dict

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
# The list and the README it cites (another list or README for this
# plugin's own tests: python/tests/test_upstream_plugin.py).
LIST = os.environ.get("ROCM_SAFE_UPSTREAM_EXPECTED") or os.path.join(HERE, "expected-failures.txt")
README = os.environ.get("ROCM_SAFE_UPSTREAM_README") or os.path.join(HERE, os.pardir, "README.md")
SECTION = "## What differs from `safetensors`"


def read_list(path: str = LIST) -> Dict[str, str]:
    """``{test id: reason}`` from the expected-failures file."""
    out: Dict[str, str] = {}
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            test, sep, reason = (part.strip() for part in line.partition("|"))
            if not sep or not test or not reason:
                raise pytest.UsageError(f"{path}:{n}: expected '<test id> | <reason>', got {line!r}")
            if test in out:
                raise pytest.UsageError(f"{path}:{n}: {test} is listed twice")
            out[test] = reason
    return out


def what_differs(path: str = README) -> str:
    """The text of the README's "What differs" section, its lines joined
    by single spaces (a reason may span a line break there)."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    start = text.find(SECTION)
    if start < 0:
        raise pytest.UsageError(f"{path} has no section {SECTION!r}")
    end = text.find("\n## ", start + len(SECTION))
    body = text[start : end if end >= 0 else len(text)]
    return re.sub(r"\s+", " ", body)


def check_reasons(expected: Dict[str, str], section: str) -> None:
    missing = [f"{t}: {r!r}" for t, r in expected.items() if re.sub(r"\s+", " ", r) not in section]
    if missing:
        raise pytest.UsageError(
            "expected failures whose reason is not in python/README.md's 'What differs': " + "; ".join(missing)
        )


def check_shim() -> None:
    import rocm_safe
    import safetensors

    where = os.path.dirname(os.path.abspath(safetensors.__file__))
    if os.path.dirname(where) != HERE or safetensors.safe_open is not rocm_safe.safe_open:
        raise pytest.UsageError(
            f"`import safetensors` is {safetensors.__file__}, not the shim in {HERE}:"
            " put that folder first on PYTHONPATH"
        )


class _Plugin:
    def __init__(self, expected: Dict[str, str]):
        self.expected = expected
        self.xfailed: set = set()

    def pytest_collection_modifyitems(self, session, config, items):
        seen = set()
        for item in items:
            reason = self.expected.get(item.nodeid)
            if reason is not None:
                seen.add(item.nodeid)
                # An assertion of the suite's that fails, nothing else (an
                # exception of ours would be a failure of the run).
                item.add_marker(
                    pytest.mark.xfail(strict=True, raises=AssertionError, reason=f"What differs: {reason}")
                )
        stale = sorted(set(self.expected) - seen)
        if stale:
            raise pytest.UsageError(f"expected failures that match no collected test: {stale}")

    def pytest_runtest_logreport(self, report):
        if report.when == "call" and getattr(report, "wasxfail", None) is not None and report.skipped:
            self.xfailed.add(report.nodeid)

    def pytest_sessionfinish(self, session, exitstatus):
        not_run = sorted(set(self.expected) - self.xfailed)
        if not_run and exitstatus == 0:
            print(f"\nrocm_safe_upstream: listed failures that did not fail as expected (skipped?): {not_run}")
            session.exitstatus = 1

    def pytest_terminal_summary(self, terminalreporter):
        terminalreporter.write_line(
            f"rocm_safe_upstream: {len(self.xfailed)} of {len(self.expected)} expected failures failed as listed"
            f" ({LIST})"
        )


def pytest_configure(config):
    check_shim()
    expected = read_list()
    check_reasons(expected, what_differs())
    config.pluginmanager.register(_Plugin(expected), "rocm_safe_upstream_checks")
