"""The distributions: complete sdist, license and metadata, one version (the lint lane).

Builds the sdist and the wheel once with ``python -m build`` (skipped where it is missing)."""

from __future__ import annotations

import email
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.lint

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    pytest.importorskip("build", reason="`build` is installed in the lint lane")
    # Build from a copy of the checkout's files (tracked or new, not ignored), as a fresh clone
    # would: a stale *.egg-info/SOURCES.txt in the checkout would otherwise fill the sdist.
    source = tmp_path_factory.mktemp("src")
    for name in _files():
        if (REPO_ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO_ROOT / name, source / name)
    out = tmp_path_factory.mktemp("dist")
    # No --sdist/--wheel: the wheel is built from the sdist, as pip builds it from PyPI, so
    # the sdist must carry everything the build needs (setup.py, the C source).
    done = subprocess.run([sys.executable, "-m", "build", "--outdir", str(out), str(source)],
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (sdist,) = out.glob("*.tar.gz")
    (wheel,) = out.glob("*.whl")
    return {"sdist": sdist, "wheel": wheel}


def _files(*folders: str) -> set[str]:
    """The checkout's files under ``folders`` (tracked, or new and not ignored)."""
    try:
        done = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard",
                               "--", *folders], cwd=REPO_ROOT,
                              capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: cannot list the tracked files")
    return {line for line in done.stdout.splitlines() if line}


def test_sdist_has_every_tracked_file_needed_to_test(dists: dict[str, Path]) -> None:
    with tarfile.open(dists["sdist"]) as tar:
        names = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
    needed = _files("portable_guided", "tests", "ci", "platforms", "docs", "scripts")
    needed |= {"LICENSE", "README.md", "CHANGELOG.md", "pyproject.toml"}  # README links it
    missing = sorted(needed - names)
    assert missing == [], missing
    assert "tests/support.py" in names  # the file whose absence broke collection


def test_wheel_metadata_license_urls_and_version(dists: dict[str, Path]) -> None:
    from portable_guided import __version__

    with zipfile.ZipFile(dists["wheel"]) as whl:
        names = whl.namelist()
        (meta_name,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        meta = email.message_from_bytes(whl.read(meta_name))
        license_files = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
        assert len(license_files) == 1
        text = whl.read(license_files[0]).decode()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert meta["Version"] == __version__
    assert meta["License-Expression"] == "Apache-2.0"
    assert meta.get_all("License-File") == ["LICENSE"]
    urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL"))
    assert set(urls) >= {"Homepage", "Source", "Issues", "Documentation"}
    assert all(u.startswith("https://") for u in urls.values())
    classifiers = meta.get_all("Classifier")
    assert "Typing :: Typed" in classifiers
    assert "Programming Language :: Python :: 3.10" in classifiers
    assert any(n.endswith("portable_guided/py.typed") for n in names)


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None,
                    reason="no C compiler: the wheel is built without the compiled kernel")
def test_wheel_built_from_the_sdist_has_the_compiled_kernel(dists: dict[str, Path]) -> None:
    with tarfile.open(dists["sdist"]) as tar:
        sdist_names = tar.getnames()
    assert not [n for n in sdist_names if n.endswith((".so", ".pyd", ".dylib"))]
    with zipfile.ZipFile(dists["wheel"]) as whl:
        kernels = [n for n in whl.namelist() if n.startswith("portable_guided/kernels/_cpu_mask")]
    assert any(n.endswith((".so", ".pyd")) for n in kernels), kernels


def test_twine_check_passes(dists: dict[str, Path]) -> None:
    pytest.importorskip("twine", reason="twine is installed in the lint lane")
    done = subprocess.run([sys.executable, "-m", "twine", "check", "--strict",
                           str(dists["sdist"]), str(dists["wheel"])],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def test_version_is_written_once() -> None:
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert "version" not in project["project"]
    assert "version" in project["project"]["dynamic"]
    dynamic = project["tool"]["setuptools"]["dynamic"]["version"]
    assert dynamic == {"attr": "portable_guided.__version__"}


def test_wheel_installs_the_lmdeploy_activation_hook(dists: dict[str, Path]) -> None:
    """lmdeploy has no plugin mechanism: the wheel puts ``portable_guided_lmdeploy.pth`` and
    its hook module at the root of site-packages (tests/lmdeploy_plugin checks the hook)."""
    with zipfile.ZipFile(dists["wheel"]) as whl:
        names = set(whl.namelist())
        pth = whl.read("portable_guided_lmdeploy.pth").decode().strip()
    assert "portable_guided_lmdeploy_hook.py" in names
    assert pth == "import portable_guided_lmdeploy_hook"
