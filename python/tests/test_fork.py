"""fork() after use: a child (DataLoader workers, gunicorn, multiprocessing
on Linux) inherits the state of rocm_safe's thread pool but not its
threads; its own conversions and loads must still finish."""

import os
import signal
import time

import numpy as np
import pytest

from rocm_safe import safe_open
from rocm_safe.numpy import load_file, save_file


def _big(tmp_path):
    p = tmp_path / "big.safetensors"
    # 4M float16 values: large enough for every parallel path.
    save_file({"a": (np.arange(4 << 20) % 2048).astype(np.float16)}, p)
    return p


def _work(p):
    a = load_file(p, dtype=np.float32)["a"]
    with safe_open(p, "np") as f:
        b = f.get_tensor("a", dtype=np.float32)
    want = (np.arange(4 << 20) % 2048).astype(np.float32)
    return bool((a == want).all() and (b == want).all())


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_work_finishes_in_a_forked_child_and_grandchild(tmp_path):
    p = _big(tmp_path)
    assert _work(p)  # the parent's pool is started

    def in_child(fn, limit=60.0):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = 0 if fn() else 1
            finally:
                os._exit(code)
        start = time.monotonic()
        while time.monotonic() - start < limit:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done == pid:
                return os.waitstatus_to_exitcode(status) == 0
            time.sleep(0.02)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise AssertionError(f"forked child hung for {limit} s")

    assert in_child(lambda: _work(p) and in_child(lambda: _work(p)))
    assert _work(p)
