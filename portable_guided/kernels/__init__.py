"""Implementations of ``apply_token_mask``, one module per strategy.

Every kernel has the signature ``kernel(logits, bitmask, plan) -> logits_or_result`` where
``plan`` is the validated :class:`portable_guided.validation.MaskPlan`. Modules import their
framework inside their functions, so importing one pulls in no framework
(``tests/test_imports.py`` checks every kernel a built-in platform names); the registry imports
a module only once its platform is chosen.
"""
