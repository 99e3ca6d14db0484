# Types of the native extension module `rocm_safe._native` (python/src/*.rs).
# CI checks them against the built module with `python -m mypy.stubtest
# rocm_safe._native` (python/typing/stubtest-allowlist.txt lists the test
# hooks that only a `--features testing` build has).
#
# Most callers use the Python API (`rocm_safe`, `rocm_safe.torch`,
# `rocm_safe.numpy`); these functions are its building blocks.

from os import PathLike
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union, final

from rocm_safe._errors import SafetensorError as SafetensorError

_Path = Union[str, PathLike[str]]
_Triple = Sequence[int]
# One guard record (python/src/guard.rs, `PyRecord`).
_GuardRecord = Tuple[int, bool, bool, bool, Optional[str], bool, bool, Optional[str]]

__version__: str

@final
class Checkpoint:
    """An open, validated checkpoint (one file or every shard of an index)."""

    def __new__(cls, path: _Path) -> Checkpoint: ...
    @property
    def path(self) -> str: ...
    @property
    def closed(self) -> bool: ...
    def close(self) -> None: ...
    def share(self) -> Checkpoint: ...
    def is_sharded(self) -> bool: ...
    def shard_paths(self) -> List[str]: ...
    def tensors(self) -> List[Tuple[str, str, List[int]]]: ...
    def describe(self, name: str) -> Tuple[str, List[int]]: ...
    def __contains__(self, key: str, /) -> bool: ...
    def __len__(self) -> int: ...
    def metadata(self) -> Optional[Dict[str, str]]: ...
    def target_dtype(self, name: str, to: Optional[str] = None, floats_only: bool = False) -> str: ...
    def read(
        self,
        name: str,
        to: Optional[str] = None,
        rows: Optional[Tuple[int, int]] = None,
        floats_only: bool = False,
    ) -> Tuple[bytearray, str, List[int]]: ...

@final
class Writer:
    """A safetensors file being written (temporary file, fsync, rename)."""

    def __new__(
        cls,
        path: _Path,
        tensors: Sequence[Tuple[str, str, Sequence[int]]],
        metadata: Optional[Dict[str, str]] = None,
    ) -> Writer: ...
    def order(self) -> List[str]: ...
    def write(self, name: str, chunk: bytes) -> None: ...
    def write_address(self, name: str, address: int, length: int) -> None: ...
    def finish(self) -> str: ...
    def abort(self) -> None: ...

@final
class LoadReport:
    """The report of a GPU load (`rocm_safe.torch.last_load_report()`)."""

    def to_dict(self) -> Dict[str, Any]: ...
    def __getitem__(self, key: str, /) -> Any: ...

def load_bytes(
    data: bytes, to: Optional[str] = None
) -> Tuple[List[Tuple[str, bytearray, str, List[int]]], Optional[Dict[str, str]]]: ...
def header_len(path: _Path, prefix: bytes, file_len: int) -> int: ...
def parse_head(
    path: _Path, head: bytes, file_len: int
) -> Tuple[List[Tuple[str, str, List[int], int, int]], Optional[Dict[str, str]]]: ...
def convert_chunk(from_: str, src: bytes, to: str) -> bytearray: ...
def doctor_report() -> Tuple[str, str, bool, bool]: ...
def features() -> List[str]: ...
def set_default_backend(name: str, reason: str = "") -> None: ...
def gpu_devices(backend: str) -> List[Tuple[int, str, str]]: ...
def kernel_loads_json() -> str: ...
def conversions() -> List[Tuple[str, str, int, int, Optional[str], Optional[str], int, bool]]: ...
def dtypes() -> List[Tuple[str, int]]: ...
def parse_device(device: str) -> Tuple[str, int]: ...
def parse_verify(name: str) -> str: ...
def load_to_device(
    checkpoint: Checkpoint,
    names: Sequence[str],
    device: str,
    dtype: Optional[str] = None,
    verify: str = "fingerprint",
    backend: Optional[str] = None,
) -> List[Tuple[str, Any]]: ...
def last_load_report() -> Optional[LoadReport]: ...
def device_owned_bytes(device: str, backend: Optional[str] = None) -> int: ...
def device_synchronize(device: str, backend: Optional[str] = None, release: bool = False) -> None: ...
def conv3d(
    device: str,
    stream: int,
    input: Any,
    weight: Any,
    bias: Any,
    out: Any,
    stride: _Triple,
    padding: _Triple,
    dilation: _Triple,
    groups: int,
    backend: Optional[str] = None,
) -> Tuple[str, str]: ...
def conv3d_stats() -> List[Tuple[str, int, int, int, int, int, int, float]]: ...
def conv3d_verify(
    device: str,
    stream: int,
    input: Any,
    weight: Any,
    bias: Any,
    out: Any,
    stride: _Triple,
    padding: _Triple,
    dilation: _Triple,
    groups: int,
    backend: Optional[str] = None,
    rel_tol: Optional[float] = None,
) -> Optional[str]: ...
def conv3d_guard(
    device: str,
    stream: int,
    input: Any,
    weight: Any,
    bias: Any,
    out: Any,
    stride: _Triple,
    padding: _Triple,
    dilation: _Triple,
    groups: int,
    backend: Optional[str] = None,
    points: bool = False,
    rel_tol: Optional[float] = None,
) -> Tuple[Optional[int], List[_GuardRecord]]: ...
def conv3d_guard_harvest(device: str, backend: Optional[str] = None) -> List[_GuardRecord]: ...
def conv3d_backward(
    device: str,
    stream: int,
    op: str,
    grad_output: Any,
    other: Any,
    out: Any,
    input_shape: Sequence[int],
    weight_shape: Sequence[int],
    stride: _Triple,
    padding: _Triple,
    dilation: _Triple,
    groups: int,
    backend: Optional[str] = None,
) -> Tuple[str, str]: ...
def conv_transpose3d(
    device: str,
    stream: int,
    input: Any,
    weight: Any,
    bias: Any,
    out: Any,
    stride: _Triple,
    padding: _Triple,
    output_padding: _Triple,
    dilation: _Triple,
    groups: int,
    backend: Optional[str] = None,
) -> Tuple[str, str]: ...
def conv_transpose3d_verify(
    device: str,
    stream: int,
    input: Any,
    weight: Any,
    bias: Any,
    out: Any,
    stride: _Triple,
    padding: _Triple,
    output_padding: _Triple,
    dilation: _Triple,
    groups: int,
    backend: Optional[str] = None,
) -> Optional[str]: ...
def move_upload(
    device: str,
    stream: int,
    srcs: Sequence[Any],
    offsets: Sequence[int],
    dst: Any,
    verify: bool = True,
    backend: Optional[str] = None,
) -> Dict[str, Any]: ...
def move_download(
    device: str,
    stream: int,
    src: Any,
    from_dtype: str,
    dst: Any,
    to_dtype: str,
    verify: bool = True,
    backend: Optional[str] = None,
) -> Dict[str, Any]: ...
def move_cast(
    device: str,
    stream: int,
    src: Any,
    from_dtype: str,
    dst: Any,
    to_dtype: str,
    verify: bool = True,
    backend: Optional[str] = None,
) -> Dict[str, Any]: ...
def tensor_fingerprints(device: str, stream: int, capsules: Sequence[Any], backend: Optional[str] = None) -> List[int]: ...
def tensor_fingerprint(device: str, stream: int, capsule: Any, backend: Optional[str] = None) -> int: ...
def bytes_fingerprint(data: bytes) -> int: ...
def load_slices_to_device(
    checkpoint: Checkpoint,
    requests: Sequence[Tuple[str, int, int, int]],
    device: str,
    dtype: Optional[str] = None,
    verify: str = "fingerprint",
    backend: Optional[str] = None,
) -> List[Tuple[str, Any]]: ...
def read_strided(path: _Path, begin: int, end: int, outer: int, stride: int, skip: int, run: int) -> bytearray: ...

# Test hooks: only in a build with `--features testing`.
def inject_conv3d_failures(kinds: Sequence[str]) -> List[str]: ...
def inject_move_faults(rules: Sequence[Tuple[str, str, int]], seed: int = 0) -> None: ...
def move_faults_injected() -> List[Tuple[str, str, int]]: ...
