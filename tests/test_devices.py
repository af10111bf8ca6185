"""``apply_token_mask`` on each built-in platform's own device, against the NumPy reference.

One case per built-in platform x framework it serves x dtype, marked with the platform's name
(and the framework's), so a CI lane selects its device with ``-m`` (``-m xpu``, ``-m npu``...).
The cases come from the registry, and the platform's hooks put the logits on its device: a new
built-in platform is tested here without editing this file. Where the platform's probe finds no
device or framework, the case is skipped with the probe's reason. ``static`` has no device of
its own and runs forced onto host tensors.
"""

from __future__ import annotations

import numpy as np
import pytest

import portable_guided as pg
from portable_guided import reference_apply_token_mask as reference
from portable_guided._frameworks import device_type_of
from portable_guided.registry import BUILTIN_PLATFORMS, REGISTRY
from tests.support import cast, make, to_f32

DTYPES = {"numpy": ("float32", "float16"), "torch": ("float32", "bfloat16", "float16"),
          "paddle": ("float32", "bfloat16", "float16"),
          "jax": ("float32", "bfloat16", "float16")}


def _cases() -> list:
    cases = []
    for name in BUILTIN_PLATFORMS:
        for framework in pg.get_platform(name).kernels:
            marks = [getattr(pytest.mark, name)]
            if framework not in ("numpy", name):
                marks.append(getattr(pytest.mark, framework))
            cases += [pytest.param(name, framework, dtype, marks=marks,
                                   id=f"{name}-{framework}-{dtype}")
                      for dtype in DTYPES[framework]]
    return cases


# (rows, width, indices, vocab_size): a few constrained rows of a padded vocabulary, and a
# full batch whose width is not a multiple of 32.
SHAPES = {
    "rows-of-4": (4, 1000, [0, 2, 3], 997),
    "batch-of-8": (8, 4099, None, None),
}


def _bitmask(rng: np.random.Generator, rows: int, width: int) -> np.ndarray:
    words = -(-width // 32)
    mask = rng.integers(-(2**31), 2**31, (rows, words), dtype=np.int64).astype(np.int32)
    mask[0] = 0
    mask[0, 3] = 0b1011  # a sparse, JSON-like row
    mask[1] = -1  # all allowed
    return mask


@pytest.mark.parametrize("bitmask_on", ["host", "device"])
@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize(("name", "framework", "dtype"), _cases())
def test_apply_on_the_platforms_device(name, framework, dtype, shape, bitmask_on):
    platform = pg.get_platform(name)
    missing = platform.probe(framework)
    if missing:
        pytest.skip(f"platform {name!r}, {framework} logits: {missing}")
    rows, width, indices, vocab_size = SHAPES[shape]
    rng = np.random.default_rng([rows, width, len(dtype)])
    values = rng.standard_normal((rows, width)).astype(np.float32)
    bitmask = _bitmask(rng, rows, width)

    logits = cast(platform.to_device(values, framework), framework, dtype)
    device_type = device_type_of(logits, framework)
    # A platform checked on a device another platform claims (static on the CPU) is forced.
    forced = None if REGISTRY.for_device(device_type) is platform else name
    assert pg.resolve(logits, platform=forced).platform is platform
    if bitmask_on == "device":
        mask_arg = platform.to_device(bitmask, framework)
    else:  # JAX has no host tensor of its own: its host bitmask is a NumPy array
        mask_arg = bitmask if framework == "jax" else make(bitmask, framework)
    before = to_f32(logits)
    expected = reference(before, bitmask, indices=indices, vocab_size=vocab_size)

    result = pg.apply_token_mask(logits, mask_arg, indices=indices, vocab_size=vocab_size,
                                 platform=forced)
    platform.synchronize(result)

    if platform.in_place:
        assert result is logits
    else:
        np.testing.assert_array_equal(to_f32(logits), before)
    assert device_type_of(result, framework) == device_type
    np.testing.assert_array_equal(to_f32(result), expected)
