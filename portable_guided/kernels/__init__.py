"""Implementations of ``apply_token_mask``, one module per strategy.

Every kernel has the signature ``kernel(logits, bitmask, plan) -> logits_or_result`` where
``plan`` is the validated :class:`portable_guided.validation.MaskPlan`. Modules import their
framework at module level, so import them only once chosen (the registry does this).
"""
