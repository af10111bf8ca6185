"""``import portable_guided`` must not pull in a tensor framework or a grammar engine."""

import subprocess
import sys

HEAVY = ("torch", "paddle", "jax", "xgrammar", "torch_xla", "llguidance", "transformers",
         "triton", "redis")


def test_import_is_light():
    code = (
        "import sys, portable_guided, portable_guided.cli\n"
        "portable_guided.cli.build_parser()\n"
        f"print(' '.join(m for m in {HEAVY!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_public_names_have_docstrings():
    import portable_guided as pg

    missing = [n for n in pg.__all__ if not n.startswith("__") and not getattr(pg, n).__doc__]
    assert missing == []


def test_every_platform_target_imports_without_a_framework():
    """Every kernel and hook a built-in platform names is a callable whose module imports no
    framework: frameworks are imported inside the functions, when one is called.

    A kernel module may refuse to import when a library it needs is not installed (the CUDA
    kernel without xgrammar or Triton), so that the platform's install hint comes at
    resolution; that only counts where the library is really missing."""
    code = (
        "import importlib, importlib.util, sys\n"
        "from portable_guided.registry import BUILTIN_PLATFORMS, get_platform\n"
        "bad = []\n"
        "for name in BUILTIN_PLATFORMS:\n"
        "    platform = get_platform(name)\n"
        "    for target in [*platform.kernels.values(), *platform.hooks.values()]:\n"
        "        module, _, attribute = target.partition(':')\n"
        "        try:\n"
        "            loaded = importlib.import_module(module)\n"
        "        except ImportError as exc:\n"
        "            if exc.name and importlib.util.find_spec(exc.name.partition('.')[0]) is None:\n"
        "                continue  # needs a library that is not installed here\n"
        "            raise\n"
        "        if not callable(getattr(loaded, attribute, None)):\n"
        "            bad.append(name + ' ' + target)\n"
        "print('not callable: ' + ', '.join(bad))\n"
        f"print('imported: ' + ' '.join(m for m in {HEAVY!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["not callable: ", "imported: "]
