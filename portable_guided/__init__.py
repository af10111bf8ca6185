"""portable_guided: grammar-constrained decoding that runs the same way on every accelerator.

The entrypoint is :func:`apply_token_mask`; :func:`resolve` shows which platform serves given
logits. Importing this package imports no tensor framework and no grammar engine.
"""

from __future__ import annotations

from .apply import apply_token_mask
from .buckets import BucketPolicy, bucket_for, bucket_sizes
from .platform import Platform
from .reference import reference_apply_token_mask
from .registry import (
    ENV_VAR,
    Resolution,
    available_platforms,
    get_platform,
    register_platform,
    resolve,
)

__version__ = "0.1.0"

__all__ = [
    "ENV_VAR",
    "BucketPolicy",
    "Platform",
    "Resolution",
    "__version__",
    "apply_token_mask",
    "available_platforms",
    "bucket_for",
    "bucket_sizes",
    "get_platform",
    "reference_apply_token_mask",
    "register_platform",
    "resolve",
]
