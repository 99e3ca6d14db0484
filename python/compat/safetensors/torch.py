"""``safetensors.torch`` is ``rocm_safe.torch`` (the same module object, so
that the private helpers the suite imports are rocm_safe's own)."""

import sys

import rocm_safe.torch as _module

sys.modules[__name__] = _module
