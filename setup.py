"""The compiled CPU kernel; everything else about the build is in pyproject.toml.

The extension is optional: where no C compiler is found the package installs without it and
the CPU platform uses its NumPy kernel (``portable_guided.kernels.host``), which gives the same
results, more slowly.
"""

import sys

from setuptools import Extension, setup

# -O3 vectorizes the scalar fallback loops; the x86-64 paths are SSE2 intrinsics (baseline).
compile_args = [] if sys.platform == "win32" else ["-O3", "-std=c99"]

setup(
    ext_modules=[
        Extension(
            "portable_guided.kernels._cpu_mask",
            sources=["portable_guided/kernels/_cpu_mask.c"],
            extra_compile_args=compile_args,
            optional=True,
        )
    ]
)
