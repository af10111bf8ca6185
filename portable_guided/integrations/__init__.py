"""Integrations with serving engines.

- :mod:`portable_guided.integrations.vllm`: a vLLM plugin (entry-point group
  ``vllm.general_plugins``) that applies vLLM's grammar bitmasks with
  :func:`portable_guided.apply_token_mask` and, optionally, serves vLLM's structured outputs
  from :class:`portable_guided.runtime.GrammarRuntime`.
- :mod:`portable_guided.integrations.sglang`: an SGLang plugin (entry-point group
  ``sglang.srt.plugins``) that applies each grammar object's vocab mask with
  :func:`portable_guided.apply_token_mask` and registers the ``portable_guided`` grammar
  backend.
- :mod:`portable_guided.integrations.lmdeploy`: lmdeploy's PyTorch engine (no plugin
  mechanism there: activated in every process by the ``portable_guided_lmdeploy.pth`` import
  hook) applies its grammar bitmasks with :func:`portable_guided.apply_token_mask` and,
  optionally, runs its guided decoding on :class:`portable_guided.runtime.GrammarRuntime`.

Nothing here is imported by ``import portable_guided``.
"""
