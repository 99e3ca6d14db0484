"""The plugin that runs the safetensors project's tests against rocm_safe
(python/compat/rocm_safe_upstream.py) fails the run in every case it
exists for: an unlisted failure, a listed test that passes, fails
otherwise than on an assertion, or did not run, a stale entry, a reason
missing from "What differs", and a `safetensors` that is not the shim.
Each case runs pytest on a small suite of its own in a subprocess."""

import os
import subprocess
import sys

import pytest

COMPAT = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "compat")

SUITE = '''
import pytest
import rocm_safe
import safetensors


def test_shim():
    assert safetensors.safe_open is rocm_safe.safe_open and safetensors.TensorSpec is rocm_safe.TensorSpec


def test_fails():
    assert False, "the suite's assertion"


def test_passes():
    assert True


def test_raises():
    raise TypeError("not an assertion")


def test_skipped():
    pytest.skip("not here")
'''

README = (
    "# x\n\n## What differs from `safetensors`\n\n- the first reason,\n  over two lines.\n\n## Next\n\n"
    "- elsewhere\n"
)


def run(tmp_path, tests, listed, readme=README, shadow=False):
    suite = tmp_path / "suite"
    (suite / "tests").mkdir(parents=True, exist_ok=True)
    (suite / "pytest.ini").write_text("[pytest]\n")
    (suite / "tests" / "test_fake.py").write_text(SUITE)
    (tmp_path / "expected.txt").write_text("# comment\n\n" + "".join(f"{t} | {r}\n" for t, r in listed))
    (tmp_path / "README.md").write_text(readme)
    path = [os.path.abspath(COMPAT)]
    if shadow:  # another `safetensors` first on the path
        (tmp_path / "other" / "safetensors").mkdir(parents=True)
        (tmp_path / "other" / "safetensors" / "__init__.py").write_text("safe_open = None\n")
        path.insert(0, str(tmp_path / "other"))
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(path),
        ROCM_SAFE_UPSTREAM_EXPECTED=str(tmp_path / "expected.txt"),
        ROCM_SAFE_UPSTREAM_README=str(tmp_path / "README.md"),
    )
    args = [f"tests/test_fake.py::{t}" for t in tests]
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "rocm_safe_upstream", *args],
        cwd=suite, env=env, capture_output=True, text=True, timeout=120,
    )
    return r.returncode, r.stdout + r.stderr


FAILS = "tests/test_fake.py::test_fails"


def test_listed_failure_passes_the_run(tmp_path):
    rc, out = run(tmp_path, ["test_shim", "test_fails", "test_passes"], [(FAILS, "the first reason, over two lines")])
    assert rc == 0, out
    assert "2 passed, 1 xfailed" in out and "1 of 1 expected failures failed as listed" in out


@pytest.mark.parametrize(
    "tests, listed, rc, says",
    [
        (["test_fails"], [], 1, "1 failed"),  # a failure not listed
        (["test_passes"], [("tests/test_fake.py::test_passes", "the first reason")], 1, "XPASS(strict)"),
        (["test_raises"], [("tests/test_fake.py::test_raises", "the first reason")], 1, "1 failed"),
        (["test_skipped"], [("tests/test_fake.py::test_skipped", "the first reason")], 1, "did not fail as expected"),
        (["test_fails"], [(FAILS, "the first reason"), ("tests/test_fake.py::test_gone", "the first reason")], 4,
         "match no collected test"),
        (["test_fails"], [(FAILS, "elsewhere")], 4, "not in python/README.md's 'What differs'"),
        (["test_fails"], [(FAILS, "")], 4, "expected '<test id> | <reason>'"),
        (["test_fails"], [(FAILS, "the first reason"), (FAILS, "the first reason")], 4, "listed twice"),
    ],
)
def test_the_run_fails(tmp_path, tests, listed, rc, says):
    code, out = run(tmp_path, tests, listed)
    assert code == rc, out
    assert says in out, out


def test_the_real_safetensors_is_refused(tmp_path):
    rc, out = run(tmp_path, ["test_fails"], [(FAILS, "the first reason")], shadow=True)
    assert rc == 4 and "not the shim" in out, out


def test_a_readme_without_the_section_is_refused(tmp_path):
    rc, out = run(tmp_path, ["test_fails"], [(FAILS, "the first reason")], readme="# nothing\n")
    assert rc == 4 and "has no section" in out, out


def test_the_repository_list_cites_the_readme():
    # The real list and README: every reason is in "What differs".
    sys.path.insert(0, os.path.abspath(COMPAT))
    try:
        import rocm_safe_upstream as plugin
    finally:
        sys.path.pop(0)
    expected = plugin.read_list()
    assert expected and all(t.startswith("tests/test_") for t in expected)
    plugin.check_reasons(expected, plugin.what_differs())
