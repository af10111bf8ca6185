"""Platform selection: device defaults, overrides, plugins, and their errors."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import portable_guided as pg
from portable_guided.platform import Platform
from portable_guided.registry import PlatformRegistry
from tests.support import HAS_TORCH, framework_params, make

HOST = "portable_guided.kernels.host:apply_host"


@pytest.mark.parametrize("framework", framework_params())
def test_cpu_logits_go_to_the_cpu_platform(framework):
    resolution = pg.resolve(make(np.zeros((2, 8), np.float32), framework))
    assert (resolution.platform.name, resolution.framework, resolution.device_type) == (
        "cpu", framework, "cpu")
    assert resolution.kernel_name == "portable_guided.kernels.host.apply_host"
    assert resolution.forced_by is None


@pytest.mark.torch
@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")
def test_unclaimed_device_falls_back_to_static_shapes():
    import torch

    resolution = pg.resolve(torch.zeros(2, 8, device="meta"))
    assert resolution.platform.name == "static" and resolution.strategy == "static shapes"


@pytest.mark.torch
@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")
def test_argument_and_environment_force_a_platform(monkeypatch):
    import torch

    logits = torch.zeros(2, 8)
    assert pg.resolve(logits, platform="xla").platform.name == "xla"
    assert pg.resolve(logits, platform="xla").forced_by == "argument"
    monkeypatch.setenv(pg.ENV_VAR, "npu")
    assert pg.resolve(logits).platform.name == "npu"
    assert pg.resolve(logits).forced_by == "environment"
    assert pg.resolve(logits, platform="cpu").platform.name == "cpu"  # argument wins


@pytest.mark.torch
@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")
def test_platform_that_cannot_serve_the_device():
    import torch

    with pytest.raises(ValueError, match="'cuda' cannot serve logits on cpu; it serves cuda"):
        pg.resolve(torch.zeros(2), platform="cuda")


def _platform(name, device_types, kernels=None):
    return Platform(name=name, description="test", device_types=device_types,
                    kernels=kernels or {"numpy": HOST}, strategy="test")


def test_register_refuses_to_overwrite_and_to_share_a_device():
    registry = PlatformRegistry(entry_point_group=None)
    registry.register(_platform("gaudi", ("hpu",)))
    with pytest.raises(ValueError, match="'gaudi' is already registered"):
        registry.register(_platform("gaudi", ("hpu",)))
    with pytest.raises(ValueError, match="'gaudi' and 'gaudi2' both claim device type 'hpu'"):
        registry.register(_platform("gaudi2", ("hpu",)))
    assert "gaudi2" not in registry.names()  # the refused registration left nothing behind
    registry.register(_platform("gaudi", ("hpu", "hpu2")), override=True)
    assert registry.get("gaudi").device_types == ("hpu", "hpu2")


def test_register_by_dotted_path_needs_a_name():
    registry = PlatformRegistry(entry_point_group=None)
    with pytest.raises(ValueError, match="a name is needed"):
        registry.register("portable_guided.platforms.cpu:PLATFORM")
    with pytest.raises(TypeError, match="'module:attribute'"):
        registry.register("no-colon")


def test_missing_framework_gives_an_install_hint():
    registry = PlatformRegistry(builtins={}, entry_point_group=None)
    registry.register(_platform(
        "exotic", ("cpu",), {"numpy": "framework_that_is_not_installed.kernels:apply"}))
    platform = registry.get("exotic")
    with pytest.raises(ImportError, match="needs framework_that_is_not_installed.*install it"):
        platform.kernel_for("numpy")
    with pytest.raises(ImportError, match="framework_that_is_not_installed"):
        registry.resolve(np.zeros(4, np.float32))


def test_fake_entry_point_plugin_is_found_and_used(tmp_path):
    """A real entry point, from a real (tiny) installed distribution on sys.path."""
    (tmp_path / "fake_plugin.py").write_text(textwrap.dedent("""
        from portable_guided.platform import Platform
        CALLS = []
        def kernel(logits, bitmask, plan):
            from portable_guided.kernels.host import apply_host
            CALLS.append(plan.batch)
            return apply_host(logits, bitmask, plan)
        PLATFORM = Platform(name="fakeplat", description="a plugin", device_types=("fakedev",),
                            kernels={"numpy": "fake_plugin:kernel"}, strategy="plugin",
                            static_shapes=True)  # so it may be forced onto CPU arrays
    """))
    dist = tmp_path / "fake_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        "[portable_guided.platforms]\nfakeplat = fake_plugin:PLATFORM\n")
    script = textwrap.dedent("""
        import numpy as np, portable_guided as pg, fake_plugin
        assert "fakeplat" in pg.available_platforms(), pg.available_platforms()
        logits = np.zeros((2, 32), np.float32)
        pg.apply_token_mask(logits, np.ones((2, 1), np.int32), platform="fakeplat")
        assert fake_plugin.CALLS == [2], fake_plugin.CALLS
        assert np.isinf(logits[:, 1:]).all() and (logits[:, 0] == 0).all()
        print(pg.resolve(logits, platform="fakeplat").strategy)
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), os.getcwd()]))
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                         check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "plugin"


def test_hooks_are_checked_and_optional():
    with pytest.raises(ValueError, match=r"unknown hook\(s\) \['prob'\]; known: probe, to_device"):
        Platform(name="typo", description="test", device_types=(), kernels={"numpy": HOST},
                 strategy="test", hooks={"prob": "x:y"})
    with pytest.raises(ValueError, match="must map to 'module:function' strings"):
        _platform("bad", ("bad",), {"numpy": "no-colon"})
    bare = _platform("bare", ("bare",))
    assert bare.probe("numpy") == "platform 'bare' has no probe hook"
    assert bare.probe("torch") == "platform 'bare' has no kernel for torch logits"
    assert bare.synchronize(np.zeros(2)) is None  # no hook: nothing to wait for
    assert bare.flush(np.zeros(2)) is None
    with pytest.raises(ValueError, match="'bare' has no to_device hook"):
        bare.to_device(np.zeros(2), "numpy")
    with pytest.raises(ValueError, match="unknown hook 'sync'"):
        bare.hook("sync")


def test_every_builtin_platform_probes_and_the_device_owner_is_found():
    for name in pg.available_platforms():
        platform = pg.get_platform(name)
        for framework in platform.kernels:  # never raises: present, or a reason
            found = platform.probe(framework)
            assert found is None or (isinstance(found, str) and found), (name, framework)
    registry = PlatformRegistry(entry_point_group=None)
    assert registry.for_device("cuda").name == "cuda"
    assert registry.for_device("mps").name == "static"  # unclaimed: the fallback
    cpu = registry.get("cpu")
    assert cpu.probe("numpy") is None
    assert cpu.to_device(np.ones(3, np.float32), "numpy").sum() == 3
