"""``safetensors.numpy`` is ``rocm_safe.numpy`` (the same module object)."""

import sys

import rocm_safe.numpy as _module

sys.modules[__name__] = _module
