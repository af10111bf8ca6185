"""The compiled CPU kernel; everything else about the build is in pyproject.toml.

The extension is optional: where no C compiler is found the package installs without it and
the CPU platform uses its NumPy kernel (``portable_guided.kernels.host``), which gives the same
results, more slowly.
"""

import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_py import build_py

# Installed beside the packages (site-packages): imports the tiny lmdeploy activation hook at
# interpreter start-up, so the lmdeploy plugin is active in every process lmdeploy spawns
# (lmdeploy has no plugin mechanism). PORTABLE_GUIDED_LMDEPLOY=0 turns it off.
PTH = "portable_guided_lmdeploy.pth"


class BuildPyWithPth(build_py):
    """build_py that also puts the .pth file at the root of the wheel."""

    def run(self):
        super().run()
        self.copy_file(PTH, str(Path(self.build_lib, PTH)), preserve_mode=0)

    def get_outputs(self, include_bytecode=True):
        return [*super().get_outputs(include_bytecode), str(Path(self.build_lib, PTH))]


cmdclass = {"build_py": BuildPyWithPth}
try:
    from setuptools.command.editable_wheel import editable_wheel
except ImportError:  # pragma: no cover - setuptools < 64
    pass
else:

    class EditableWheelWithPth(editable_wheel):
        """An editable install gets the same .pth file (its build_py output is not copied)."""

        def _create_wheel_file(self, bdist_wheel):
            from wheel.wheelfile import WheelFile

            path = super()._create_wheel_file(bdist_wheel)
            with WheelFile(path, "a") as wheel:
                wheel.write(PTH, PTH)
            return path

    cmdclass["editable_wheel"] = EditableWheelWithPth

# -O3 vectorizes the scalar fallback loops; the x86-64 paths are SSE2 intrinsics (baseline).
compile_args = [] if sys.platform == "win32" else ["-O3", "-std=c99"]

setup(
    cmdclass=cmdclass,
    ext_modules=[
        Extension(
            "portable_guided.kernels._cpu_mask",
            sources=["portable_guided/kernels/_cpu_mask.c"],
            extra_compile_args=compile_args,
            optional=True,
        )
    ]
)
