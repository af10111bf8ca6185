"""Ascend NPU (``torch_npu``, Paddle custom device ``npu``): static shapes."""

from __future__ import annotations

from typing import Any

from ..platform import Platform
from ._devices import missing

PLATFORM = Platform(
    name="npu",
    description="Ascend NPU (torch_npu, Paddle custom device): static shapes",
    device_types=("npu",),
    kernels={
        "torch": "portable_guided.kernels.static_torch:apply_static_torch",
        "paddle": "portable_guided.kernels.static_paddle:apply_static_paddle",
    },
    strategy="static shapes",
    static_shapes=True,
    install_hints={"torch": "pip install torch_npu matching your torch"},
    hooks={
        "probe": "portable_guided.platforms.npu:probe",
        "to_device": "portable_guided.platforms.npu:to_device",
        "synchronize": "portable_guided.platforms._devices:synchronize",
    },
)


def probe(framework: str) -> str | None:
    """An Ascend NPU visible to ``torch_npu``, or Paddle's ``npu`` custom device."""
    if framework == "torch":
        why = missing("torch") or missing("torch_npu")
        if why:
            return why
        import torch
        import torch_npu  # noqa: F401 - registers torch.npu

        return None if torch.npu.is_available() else "no Ascend NPU visible to torch_npu"
    why = missing(framework)
    if why:
        return why
    import paddle

    if "npu" not in paddle.device.get_all_custom_device_type():
        return "paddle has no 'npu' custom device (install the Ascend plugin for Paddle)"
    return None


def to_device(array: Any, framework: str) -> Any:
    """``array`` on NPU 0."""
    if framework == "torch":
        import torch
        import torch_npu  # noqa: F401 - registers the "npu" device type

        return torch.from_numpy(array).to("npu")
    import paddle

    return paddle.to_tensor(array, place=paddle.CustomPlace("npu", 0))
