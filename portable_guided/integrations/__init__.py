"""Integrations with serving engines.

- :mod:`portable_guided.integrations.vllm`: a vLLM plugin (entry-point group
  ``vllm.general_plugins``) that applies vLLM's grammar bitmasks with
  :func:`portable_guided.apply_token_mask` and, optionally, serves vLLM's structured outputs
  from :class:`portable_guided.runtime.GrammarRuntime`.

Nothing here is imported by ``import portable_guided``.
"""
