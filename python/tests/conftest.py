"""Shared helpers of the rocm_safe tests."""

import json
import struct

import pytest


def raw_file(header, data=b"", *, pad=True, prefix_len=None):
    """Bytes of a safetensors file with ``header`` (a dict, or str/bytes
    used verbatim) and ``data``."""
    if isinstance(header, dict):
        header = json.dumps(header, separators=(",", ":"))
    if isinstance(header, str):
        header = header.encode("utf-8")
    if pad:
        header = header + b" " * (-len(header) % 8)
    n = len(header) if prefix_len is None else prefix_len
    return struct.pack("<Q", n) + header + data


@pytest.fixture
def write_raw(tmp_path):
    """write_raw(name, header, data=b"", **kw) -> path of a new file."""

    def write(name, header, data=b"", **kw):
        p = tmp_path / name
        p.write_bytes(raw_file(header, data, **kw))
        return p

    return write
