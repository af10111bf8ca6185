"""SGLang's ``apply_vocab_mask`` functions, served by :func:`portable_guided.apply_token_mask`.

SGLang applies a batch's grammar mask with ``GrammarMask.apply``:
``grammar.apply_vocab_mask(logits=logits, vocab_mask=mask)`` on one grammar object of the
batch (a reasoner wrapper hands out its inner grammar's function, or its backend's static
one). Both xgrammar and llguidance fill int32 bitmask words (token ``t`` allowed when bit
``t % 32`` of word ``t // 32`` is set, -1 = all allowed): our layout, so each hook is one
:func:`apply_token_mask` call on the logits' own device and dtype. The two differ only where
the logits are wider than the mask: xgrammar leaves those columns alone (with a warning),
llguidance sets them to ``-inf``; each hook keeps its backend's behaviour.

Outlines fills a bool tensor instead (True = blocked, one per token) that SGLang applies
with one ``masked_fill_``. On the CPU its hook packs that mask into words (``numpy.packbits``
of the blocked bits, then the words inverted: a pass over the bools and one over the words)
and applies it through :func:`apply_token_mask`: 0.25-0.64x the time of the ``masked_fill_`` in
every cell measured, the pack included (``bench/bench_outlines_mask.py``). On an accelerator
``masked_fill_`` is one fused kernel that a pack would only add a pass to, so SGLang's own
runs there.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from ...apply import apply_token_mask
from ...registry import resolve
from .guard import Takeover, kind_of

__all__ = ["TAKEOVERS", "apply_llguidance", "apply_outlines", "apply_xgrammar",
           "guidance_apply_vocab_mask", "outlines_apply_vocab_mask", "outlines_words",
           "xgrammar_apply_vocab_mask", "xgrammar_static_apply_vocab_mask"]

logger = logging.getLogger("sglang.plugins.portable_guided")

#: Hook name -> its takeover, while installed (set by :func:`..register`).
TAKEOVERS: dict[str, Takeover] = {}
_first_apply = threading.Event()


def apply_xgrammar(logits: Any, vocab_mask: Any) -> None:
    """xgrammar's ``apply_token_bitmask_inplace`` semantics (SGLang's xgrammar backend)."""
    masked = apply_token_mask(logits, vocab_mask)
    if masked is not logits:  # a platform that is not in place (none built in today)
        logits.copy_(masked)
    _log_first(logits)


def apply_llguidance(logits: Any, vocab_mask: Any) -> None:
    """``llguidance.torch.apply_token_bitmask_inplace`` semantics (SGLang's llguidance
    backend): 1-D inputs are one row, and columns past ``32 * words`` become ``-inf``."""
    import torch

    if logits.dim() == 1:
        logits = logits.unsqueeze(0)
    if vocab_mask.dim() == 1:
        vocab_mask = vocab_mask.unsqueeze(0)
    if vocab_mask.dtype != torch.int32:
        raise TypeError(f"the llguidance vocab mask must be int32, got {vocab_mask.dtype}")
    if logits.dim() != 2 or logits.shape[0] != vocab_mask.shape[0]:
        raise ValueError(
            f"logits of shape {tuple(logits.shape)} and vocab mask of shape "
            f"{tuple(vocab_mask.shape)}: llguidance needs 2-D logits with one mask row each")
    cutoff = 32 * int(vocab_mask.shape[1])
    head = logits[:, :cutoff] if logits.shape[1] > cutoff else logits
    masked = apply_token_mask(head, vocab_mask)  # checks the input before writing
    if masked is not head:
        head.copy_(masked)
    if head is not logits:
        logits[:, cutoff:] = float("-inf")
    _log_first(logits)


def outlines_words(vocab_mask: Any) -> Any:
    """Outlines' 2-D bool vocab mask on the CPU (True = blocked) as int32 bitmask words (bit
    set = allowed), as wide as whole words need: the blocked bits packed (little bit order),
    then the words inverted in place, which is cheaper than inverting the bools first."""
    import numpy as np
    import torch

    packed = np.packbits(vocab_mask.numpy(), axis=1, bitorder="little")
    if packed.shape[1] % 4:  # (whole words; the padding reads as allowed, past the logits)
        packed = np.pad(packed, ((0, 0), (0, 4 - packed.shape[1] % 4)))
    words = packed.view(np.int32)
    np.invert(words, out=words)
    return torch.from_numpy(words)


def apply_outlines(logits: Any, vocab_mask: Any) -> None:
    """``logits.masked_fill_(vocab_mask, -inf)`` (SGLang's outlines backend). A 2-D bool mask
    of the logits' shape on the CPU goes through :func:`apply_token_mask` as words
    (:func:`outlines_words`); any other call (an accelerator, other shapes) runs that
    ``masked_fill_`` itself."""
    import torch

    if (logits.is_cpu and vocab_mask.is_cpu and vocab_mask.dtype == torch.bool
            and logits.dim() == 2 and vocab_mask.shape == logits.shape):
        masked = apply_token_mask(logits, outlines_words(vocab_mask))
        if masked is not logits:  # a platform that is not in place (none built in today)
            logits.copy_(masked)
    else:
        logits.masked_fill_(vocab_mask, float("-inf"))
    _log_first(logits)


def xgrammar_cpu_reference(logits: Any, vocab_mask: Any) -> None:
    """SGLang's CPU path for xgrammar bitmasks (``XGrammarGrammar.apply_vocab_mask`` on a
    CPU tensor: xgrammar's CPU kernel), on a CPU copy for logits on any device."""
    from xgrammar import apply_token_bitmask_inplace

    host = logits.detach().to("cpu", copy=True)
    apply_token_bitmask_inplace(host, vocab_mask.to("cpu"), backend="cpu")
    logits.copy_(host)


def _run(hook: str, logits: Any, vocab_mask: Any, ours: Any, theirs: Any) -> None:
    """``ours`` on the logits, or SGLang's own (``theirs(takeover)`` builds it) once restored;
    the canary compares both on a call of a kind it has not seen. Paid on every decode step,
    so the common path reads the call's kind and nothing else."""
    takeover = TAKEOVERS.get(hook)
    if takeover is None:  # restored while this call was on its way: SGLang's own
        theirs(None)(logits)
        return
    canary = takeover.canary
    if canary is not None and not canary.tripped:
        kind = kind_of(logits, vocab_mask)
        if kind not in canary.seen:
            canary.check(logits, (kind,), lambda out: ours(out, vocab_mask), theirs(takeover))
            return
    ours(logits, vocab_mask)


def xgrammar_apply_vocab_mask(self: Any, logits: Any, vocab_mask: Any) -> None:
    """Replaces ``XGrammarGrammar.apply_vocab_mask`` (sglang 0.5.23)."""
    def theirs(takeover: Takeover | None) -> Any:
        def run(out: Any) -> None:
            if takeover is None:
                xgrammar_cpu_reference(out, vocab_mask)
            else:
                takeover.original(self, logits=out, vocab_mask=vocab_mask)
        return run

    _run("xgrammar", logits, vocab_mask, apply_xgrammar, theirs)


def xgrammar_static_apply_vocab_mask(logits: Any, vocab_mask: Any) -> None:
    """Replaces the static ``XGrammarGrammarBackend.apply_vocab_mask`` (sglang 0.5.23), which
    SGLang's reasoner uses for rows without a grammar; upstream it raises
    ``Unsupported device: cpu`` on the CPU, where the canary compares with SGLang's CPU path
    of the same mask (xgrammar's CPU kernel)."""
    def theirs(takeover: Takeover | None) -> Any:
        def run(out: Any) -> None:
            if takeover is None or out.device.type == "cpu":
                xgrammar_cpu_reference(out, vocab_mask)
            else:
                takeover.original(logits=out, vocab_mask=vocab_mask)
        return run

    _run("xgrammar_static", logits, vocab_mask, apply_xgrammar, theirs)


def guidance_apply_vocab_mask(logits: Any, vocab_mask: Any) -> None:
    """Replaces the static ``GuidanceGrammar.apply_vocab_mask`` (sglang 0.5.23)."""
    def theirs(takeover: Takeover | None) -> Any:
        def run(out: Any) -> None:
            if takeover is None:
                from llguidance.torch import apply_token_bitmask_inplace

                apply_token_bitmask_inplace(out, vocab_mask)
            else:
                takeover.original(logits=out, vocab_mask=vocab_mask)
        return run

    _run("llguidance", logits, vocab_mask, apply_llguidance, theirs)


def outlines_apply_vocab_mask(logits: Any, vocab_mask: Any) -> None:
    """Replaces the static ``OutlinesGrammar.apply_vocab_mask`` (sglang 0.5.23)."""
    def theirs(takeover: Takeover | None) -> Any:
        def run(out: Any) -> None:
            if takeover is None:
                out.masked_fill_(vocab_mask, float("-inf"))
            else:
                takeover.original(logits=out, vocab_mask=vocab_mask)
        return run

    _run("outlines", logits, vocab_mask, apply_outlines, theirs)


#: Hook name -> (our replacement, whether SGLang's function is a staticmethod).
HOOKS: dict[str, tuple[Any, bool]] = {
    "xgrammar": (xgrammar_apply_vocab_mask, False),
    "xgrammar_static": (xgrammar_static_apply_vocab_mask, True),
    "llguidance": (guidance_apply_vocab_mask, True),
    "outlines": (outlines_apply_vocab_mask, True),
}


def _log_first(logits: Any) -> None:
    if not _first_apply.is_set():
        _first_apply.set()
        logger.info("portable_guided applied the first grammar vocab mask in this process "
                    "(pid %d): %s", os.getpid(), resolve(logits))
