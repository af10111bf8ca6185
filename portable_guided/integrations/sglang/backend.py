"""The grammar backend ``portable_guided``: our runtime behind SGLang's grammar contract.

Registered with SGLang's ``register_grammar_backend`` and selected with ``--grammar-backend
portable_guided``. Grammars compile in the :class:`~portable_guided.runtime.GrammarRuntime`
(worker processes killed at a real time limit, in-flight deduplication, memory and optional
disk caches shared by processes); a batch's rows are filled by one batched call
(``fill_vocab_mask_batched``); masks are applied by :func:`portable_guided.apply_token_mask`
on the logits' device. Masks use xgrammar's int32 layout, so SGLang's reasoner wrapper and
its token filter (strict thinking) work on them unchanged: with a reasoning parser the
backend is wrapped in SGLang's own ``ReasonerGrammarBackend``, exactly as SGLang wraps its
built-in backends (the constraint starts after the think-end tokens).

Languages follow SGLang's xgrammar backend: JSON schemas in xgrammar's strict mode
(:func:`xgrammar_strict_schema`), ``$$ANY$$`` for any JSON, EBNF with root ``root``, regex,
structural tags in the ``structures``/``triggers`` format. A spec the runtime refuses or cannot compile gives
SGLang's ``InvalidGrammarObject`` with the reason: that request fails, the others go on.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

import torch
from sglang.srt.constrained.base_grammar_backend import (
    BaseGrammarBackend,
    BaseGrammarObject,
    GrammarRow,
    GrammarStats,
    InvalidGrammarObject,
)

from ...json_schema.strict import xgrammar_strict_schema
from ...runtime import GrammarRuntime, GrammarSpec, Request, load_tokenizer_info
from ...runtime.errors import GrammarError
from .._settings import env_seconds
from .apply import apply_xgrammar

__all__ = ["PortableGuidedGrammar", "PortableGuidedGrammarBackend", "create_backend",
           "register_backend", "xgrammar_strict_schema"]

logger = logging.getLogger("sglang.plugins.portable_guided")

BACKEND_NAME = "portable_guided"


class PortableGuidedGrammar(BaseGrammarObject):
    """One request's grammar: a runtime :class:`Request` with SGLang's semantics."""

    def __init__(self, request: Request, spec: GrammarSpec, runtime: GrammarRuntime,
                 key_string: str = "") -> None:
        super().__init__()
        self.request = request
        self.spec = spec
        self.runtime = runtime
        self.key_string = key_string
        self.grammar_stats = GrammarStats(dispatch_type=spec.kind)

    def accept_token(self, token: int) -> None:
        """Advance by ``token``; ``ValueError`` when the grammar rejects it (as SGLang's
        xgrammar backend: the scheduler aborts that request). Ignored once terminated."""
        if self.request.is_terminated:
            return
        self.current_token = token
        try:
            accepted = self.request.accept(int(token))
        except GrammarError as exc:
            raise ValueError(f"Tokens not accepted: {token} ({exc}); key string: "
                             f"{self.key_string[:200]!r}") from exc
        if not accepted:
            raise ValueError(f"Tokens not accepted: {token}; key string: "
                             f"{self.key_string[:200]!r}")

    def rollback(self, k: int) -> None:
        """Undo the last ``k`` accepted tokens."""
        if k > 0:
            self.request.rollback(k)

    def is_terminated(self) -> bool:
        """True once the grammar accepted a stop token."""
        return bool(self.request.is_terminated)

    def allocate_vocab_mask(self, vocab_size: int, batch_size: int, device: Any) -> Any:
        """All-allowed int32 rows on the CPU (the runtime fills them there)."""
        return torch.from_numpy(self.runtime.allocate_bitmask(batch_size))

    def fill_vocab_mask(self, vocab_mask: Any, idx: int) -> None:
        """Fill row ``idx`` (SGLang's per-row path; the reasoner calls it)."""
        self.request.fill(vocab_mask, idx)

    @staticmethod
    def fill_vocab_mask_batched(entries: list[GrammarRow], vocab_mask: Any) -> None:
        """One batched runtime fill for our rows; other grammars fill their own rows."""
        ours = [e for e in entries if isinstance(e.grammar, PortableGuidedGrammar)]
        others = [e for e in entries if not isinstance(e.grammar, PortableGuidedGrammar)]
        by_runtime: dict[int, list[GrammarRow]] = {}
        for entry in ours:
            by_runtime.setdefault(id(entry.grammar.runtime), []).append(entry)
        for group in by_runtime.values():
            runtime = group[0].grammar.runtime
            runtime.fill_bitmask([e.grammar.request for e in group],
                                 vocab_mask, rows=[e.row for e in group])
        for entry in others:
            entry.grammar.fill_vocab_mask(vocab_mask, entry.row)

    @staticmethod
    def reset_vocab_mask(vocab_mask: Any) -> None:
        """Back to all allowed."""
        vocab_mask.fill_(-1)

    @staticmethod
    def move_vocab_mask(vocab_mask: Any, device: Any) -> Any:
        """To the logits' device (pinned-memory free: ``apply_token_mask`` also takes a
        CPU bitmask)."""
        return vocab_mask.to(device, non_blocking=True)

    @staticmethod
    def apply_vocab_mask(logits: Any, vocab_mask: Any) -> None:
        """:func:`portable_guided.apply_token_mask`, in place, on the logits' device."""
        apply_xgrammar(logits, vocab_mask)

    def copy(self) -> PortableGuidedGrammar:
        """A fresh request on the same compiled grammar (a memory-cache hit)."""
        request = self.runtime.new_request(self.spec, on_error="raise")
        request.wait()
        return PortableGuidedGrammar(request, self.spec, self.runtime, self.key_string)

    def try_jump_forward(self, tokenizer: Any) -> tuple[list[int], str] | None:
        """The text the grammar forces next, or None."""
        text = self.request.jump_forward()
        return ([], text) if text else None

    def jump_forward_str_state(self, helper: tuple[list[int], str]) -> tuple[str, int]:
        """SGLang's xgrammar convention: ``(text, -1)``."""
        return helper[1], -1

    def jump_and_retokenize(self, old_output_ids: list[int], new_output_ids: list[int],
                            next_state: int) -> None:
        """Roll back to the common prefix of the old and new ids, then accept the rest."""
        k = 0
        for old, new in zip(old_output_ids, new_output_ids):
            if old != new:
                break
            k += 1
        if k < len(old_output_ids):
            self.request.rollback(len(old_output_ids) - k)
        for token in new_output_ids[k:]:
            self.accept_token(token)

    def __repr__(self) -> str:
        return f"PortableGuidedGrammar({self.spec.kind}, {self.key_string[:60]!r})"


#: The grammar engine unless ``PORTABLE_GUIDED_SGLANG_ENGINE`` names another.
BACKEND_ENGINE = "auto"


class PortableGuidedGrammarBackend(BaseGrammarBackend):
    """SGLang grammar backend served by one :class:`GrammarRuntime`."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: Any = None, *,
                 any_whitespace: bool = True) -> None:
        super().__init__()
        stop = sorted(int(t) for t in eos_token_ids) if eos_token_ids else None
        info = load_tokenizer_info(tokenizer, vocab_size=vocab_size, stop_token_ids=stop)
        # The runtime's default (auto), chosen by measurement as for vLLM (docs/latency.md):
        # the language is SGLang's (xgrammar's strict mode) on every engine; `xgrammar`
        # keeps masks identical to SGLang's own xgrammar backend.
        self.engine = os.environ.get("PORTABLE_GUIDED_SGLANG_ENGINE", BACKEND_ENGINE)
        timeout_s = env_seconds("PORTABLE_GUIDED_SGLANG_COMPILE_TIMEOUT_S", 30.0)
        self.runtime = GrammarRuntime(
            info, engine=self.engine, compile_timeout_s=timeout_s,
            disk_cache_dir=os.environ.get("PORTABLE_GUIDED_SGLANG_CACHE_DIR") or None,
            # As for vLLM: compiles start here and reach a worker only past a quarter second.
            compile_race=os.environ.get("PORTABLE_GUIDED_SGLANG_COMPILE_RACE", "1") == "1")
        self.vocab_size = vocab_size
        self.any_whitespace = any_whitespace
        logger.info("portable_guided grammar runtime serves SGLang's constrained decoding "
                    "(engine %s, compile limit %s s, pid %d)", self.engine, timeout_s,
                    os.getpid())

    # Masks are xgrammar's layout: SGLang's token filter (strict thinking) applies as is.
    @property
    def is_support_token_filter(self) -> bool:
        return True

    def set_token_filter(self, vocab_mask: Any, token_ids: Any, batch_idx: int,
                         is_allowed: bool = True, reset_vocab_mask: bool = True) -> None:
        """SGLang's own filter for xgrammar bitmasks."""
        from sglang.srt.constrained.xgrammar_backend import XGrammarGrammarBackend

        XGrammarGrammarBackend.set_token_filter(vocab_mask, token_ids, batch_idx,
                                                is_allowed=is_allowed,
                                                reset_vocab_mask=reset_vocab_mask)

    def allocate_vocab_mask(self, vocab_size: int, batch_size: int, device: Any) -> Any:
        """All-allowed rows (the reasoner's rows without a grammar)."""
        return torch.from_numpy(self.runtime.allocate_bitmask(batch_size))

    @staticmethod
    def move_vocab_mask(vocab_mask: Any, device: Any) -> Any:
        return vocab_mask.to(device, non_blocking=True)

    @staticmethod
    def apply_vocab_mask(logits: Any, vocab_mask: Any) -> None:
        apply_xgrammar(logits, vocab_mask)

    def _compile(self, spec_of: Any, key_string: str) -> BaseGrammarObject:
        try:
            spec = spec_of()
            request = self.runtime.new_request(spec, on_error="raise")
            request.wait()
        except (GrammarError, ValueError, TypeError) as exc:
            return self._invalid(key_string, exc)
        if request.failed:
            return self._invalid(key_string, request.error)
        return PortableGuidedGrammar(request, spec, self.runtime, key_string)

    @staticmethod
    def _invalid(key_string: str, error: BaseException | None) -> BaseGrammarObject:
        message = f"{type(error).__name__}: {error}"
        logger.error("portable_guided refused a grammar (%s): %r", message, key_string[:200])
        return InvalidGrammarObject(message)

    def dispatch_json(self, key_string: str) -> BaseGrammarObject:
        if key_string == "$$ANY$$":
            return self._compile(lambda: GrammarSpec.any_json(
                any_whitespace=self.any_whitespace), key_string)

        def spec() -> GrammarSpec:
            try:
                text = json.dumps(xgrammar_strict_schema(json.loads(key_string)),
                                  ensure_ascii=False)
            except (ValueError, RecursionError):
                text = key_string  # not JSON, or too deep: GrammarSpec says which
            return GrammarSpec.json_schema(text, any_whitespace=self.any_whitespace)

        return self._compile(spec, key_string)

    def dispatch_regex(self, key_string: str) -> BaseGrammarObject:
        return self._compile(lambda: GrammarSpec.regex(key_string), key_string)

    def dispatch_ebnf(self, key_string: str) -> BaseGrammarObject:
        return self._compile(lambda: GrammarSpec.ebnf(key_string), key_string)

    def dispatch_structural_tag(self, key_string: str) -> BaseGrammarObject:
        def spec() -> GrammarSpec:
            tag = json.loads(key_string)
            if not isinstance(tag, dict) or "structures" not in tag:
                raise GrammarError("portable_guided serves structural tags in the "
                                   "'structures'/'triggers' format only")
            return GrammarSpec.structural_tag(
                [{"begin": s["begin"], "schema": s["schema"], "end": s["end"]}
                 for s in tag["structures"]], tag["triggers"])

        return self._compile(spec, key_string)

    def reset(self) -> None:
        super().reset()


def create_backend(server_args: Any, tokenizer: Any, vocab_size: int,
                   eos_token_ids: Any = None) -> BaseGrammarBackend:
    """The ``init_func`` given to ``register_grammar_backend``: SGLang calls it from
    ``create_grammar_backend``. With a reasoning parser the backend is wrapped in SGLang's
    ``ReasonerGrammarBackend``, as SGLang wraps its built-in ones."""
    backend: BaseGrammarBackend = PortableGuidedGrammarBackend(
        tokenizer, vocab_size, eos_token_ids,
        any_whitespace=not getattr(server_args, "constrained_json_disable_any_whitespace",
                                   False))
    reasoning_parser = getattr(server_args, "reasoning_parser", None)
    if reasoning_parser:
        from sglang.srt.constrained.reasoner_grammar_backend import ReasonerGrammarBackend
        from sglang.srt.parser.reasoning_parser import ReasoningParser

        parser = ReasoningParser(model_type=reasoning_parser, stream_reasoning=False,
                                 tokenizer=tokenizer)
        backend = ReasonerGrammarBackend(
            backend, parser, tokenizer,
            enable_strict_thinking=bool(getattr(server_args, "enable_strict_thinking", False)))
    return backend


def register_backend() -> None:
    """Register ``portable_guided`` with SGLang's grammar-backend registry and CLI choices."""
    from sglang.srt.constrained.base_grammar_backend import (
        GRAMMAR_BACKEND_REGISTRY,
        register_grammar_backend,
    )

    if GRAMMAR_BACKEND_REGISTRY.get(BACKEND_NAME) is create_backend:
        return
    register_grammar_backend(BACKEND_NAME, create_backend)
    try:
        from sglang.srt.arg_groups.choices import (
            GRAMMAR_BACKEND_CHOICES,
            add_grammar_backend_choices,
        )
    except ImportError:  # another layout: the name still works where choices are free
        return
    if BACKEND_NAME not in GRAMMAR_BACKEND_CHOICES:
        add_grammar_backend_choices([BACKEND_NAME])
