"""The XLA lane's tests run torch_xla on a PJRT device: the CPU client unless the environment
says otherwise (the ``tpu`` lane sets ``PJRT_DEVICE=TPU``). Set before torch_xla is imported."""

from __future__ import annotations

import os

os.environ.setdefault("PJRT_DEVICE", "CPU")
os.environ.setdefault("CPU_NUM_DEVICES", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
