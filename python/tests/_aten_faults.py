"""torch's convolution made to fail where vendor libraries fail: inside
``aten::convolution`` and ``aten::convolution_backward``, as kernels
registered with ``torch.library`` for the CPU (and CUDA) dispatch keys,
not by replacing ``torch.nn.functional.conv3d``. Every path that reaches
torch's conv (eager, compiled graphs, autocast after its cast, checkpoint
recomputes, traces, torch.func) reaches the fault.

``with aten_faults(forward="raises", backward="nan") as f:`` ...; ``f.calls``
counts the faulted calls (a test asserts the fault fired). Leaving the
block removes the kernels (torch's own are back).
"""

from __future__ import annotations

import warnings

import torch

_K = torch._C.DispatchKey
# torch's own kernels of both ops are CompositeExplicitAutograd (the CUDA
# one of convolution_backward is the same function): a backend key with no
# kernel of its own reaches it.
_BELOW = torch._C.DispatchKeySet(_K.PrivateUse1)
_CONV = torch.ops.aten.convolution.default
_CONV_BACKWARD = torch.ops.aten.convolution_backward.default
FAILURES = ("raises", "nan", "wrong")
_active = []


def _spoil(t, failure):
    if t is None:
        return t
    if failure == "nan":
        return torch.full_like(t, float("nan"))
    # Finite and wrong beyond any tolerance the checks use (a fixed share of
    # the largest value added, as a broken kernel might).
    return t * 1.02 + 0.3 * (t.abs().max() + 1)


class Faults:
    def __init__(self, forward=None, backward=None):
        for f in (forward, backward):
            if f is not None and f not in FAILURES:
                raise ValueError(f)
        self.forward, self.backward = forward, backward
        self.calls = {"forward": 0, "backward": 0}
        self._lib = None

    def _forward(self, keyset, *args):
        if args[1].dim() != 5:  # conv1d/2d pass (a 3-d conv fails, as MIOpen's do)
            return _CONV.redispatch(_BELOW, *args)
        self.calls["forward"] += 1
        if self.forward == "raises":
            raise RuntimeError("miopenStatusUnknownError (injected in aten::convolution)")
        return _spoil(_CONV.redispatch(_BELOW, *args), self.forward)

    def _backward(self, keyset, *args):
        if args[2].dim() != 5:
            return _CONV_BACKWARD.redispatch(_BELOW, *args)
        self.calls["backward"] += 1
        if self.backward == "raises":
            raise RuntimeError("CUDNN_STATUS_EXECUTION_FAILED (injected in aten::convolution_backward)")
        return tuple(_spoil(t, self.backward) for t in _CONV_BACKWARD.redispatch(_BELOW, *args))

    def __enter__(self):
        self._lib = torch.library.Library("aten", "IMPL")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "overriding a previously registered kernel"
            for key in ("CPU", "CUDA"):
                if self.forward is not None:
                    self._lib.impl("convolution", self._forward, key, with_keyset=True)
                if self.backward is not None:
                    self._lib.impl("convolution_backward", self._backward, key, with_keyset=True)
        _active.append(self)
        return self

    def __exit__(self, *exc):
        self.remove()
        return False

    def remove(self):
        if self._lib is not None:
            self._lib._destroy()
            self._lib = None
        if self in _active:
            _active.remove(self)


def aten_faults(forward=None, backward=None) -> Faults:
    return Faults(forward, backward)


def remove_all() -> None:
    """Removes any fault a failed test left (an autouse fixture calls it)."""
    for f in list(_active):
        f.remove()
