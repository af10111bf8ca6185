"""Integrations with serving engines.

- :mod:`portable_guided.integrations.vllm`: a vLLM plugin (entry-point group
  ``vllm.general_plugins``) that applies vLLM's grammar bitmasks with
  :func:`portable_guided.apply_token_mask` and, optionally, serves vLLM's structured outputs
  from :class:`portable_guided.runtime.GrammarRuntime`.
- :mod:`portable_guided.integrations.sglang`: an SGLang plugin (entry-point group
  ``sglang.srt.plugins``) that applies each grammar object's vocab mask with
  :func:`portable_guided.apply_token_mask` and registers the ``portable_guided`` grammar
  backend.

Nothing here is imported by ``import portable_guided``.
"""
