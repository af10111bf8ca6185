"""The jax-cpu lane runs JAX on its CPU backend unless the environment names another
(a TPU or GPU runner sets ``JAX_PLATFORMS``). Set before JAX is imported."""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
