"""Our :class:`~portable_guided.runtime.GrammarRuntime` as vLLM's structured-output backend.

Turned on by ``PORTABLE_GUIDED_VLLM_BACKEND=1``. Requests whose backend vLLM resolved to
``xgrammar`` or ``guidance`` are then compiled by the runtime (worker processes killed at a
real time limit, in-flight deduplication, memory and optional disk caches shared by
processes) and filled with one batched, multi-threaded call per step. vLLM's scheduler keeps
its own roles: it decides which rows are constrained (reasoning phases), fails a request
whose token the grammar rejects, and rolls back speculative tokens.

Languages match vLLM's ``xgrammar`` backend: JSON schemas in xgrammar's strict mode (no
undeclared properties where an object names some: :func:`xgrammar_strict_schema`),
``any_whitespace`` unless ``disable_any_whitespace``, EBNF with root ``root``, choices as
vLLM's own choice grammar. Differences, documented in the README: Lark grammars and the
newer structural-tag format are refused (the request fails alone); stop tokens are the tokenizer's end tokens, not
per-request extra stop ids. On vLLM 0.33 the special tokens are left out of every grammar
but structural tags, as its xgrammar backend does (:func:`vocabulary_filtered_ids`).

Compiles never wait in vLLM's grammar thread: ``grammar_init`` hands the spec to the
runtime and gives vLLM a future that the runtime resolves when the compile ends.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from vllm.v1.structured_output import StructuredOutputManager
from vllm.v1.structured_output.backend_types import (
    StructuredOutputBackend,
    StructuredOutputGrammar,
    StructuredOutputOptions,
)

from ...json_schema.strict import xgrammar_strict_schema
from ...runtime import GrammarRuntime, GrammarSpec, Request, load_tokenizer_info
from ...runtime.errors import GrammarError
from .._settings import env_seconds

#: The grammar engine this backend uses unless ``PORTABLE_GUIDED_VLLM_ENGINE`` names another:
#: the runtime's default, chosen by measurement (docs/latency.md; new Github_hard schemas:
#: first token 0.87x vLLM alone's at B=1 and 0.39x at B=16, where xgrammar gave 1.55x and
#: 1.62x, bench/results/vllm_cpu_cold_hard.json).
BACKEND_ENGINE = "auto"

if TYPE_CHECKING:
    import numpy.typing as npt

__all__ = ["PortableGuidedBackend", "PortableGuidedGrammar", "install_backend",
           "start_runtime", "uninstall_backend", "vocabulary_filtered_ids"]

logger = logging.getLogger("vllm.plugins.portable_guided")

#: vLLM backend names whose requests the runtime serves.
SERVED_BACKENDS = ("xgrammar", "guidance")
_ORIGINALS: dict[str, Any] = {}
_lock = threading.Lock()


@dataclass
class PortableGuidedBackend(StructuredOutputBackend):
    """vLLM ``StructuredOutputBackend`` backed by one :class:`GrammarRuntime` per engine."""

    #: The backend vLLM resolved for the requests (``xgrammar`` or ``guidance``): it decides
    #: the JSON-schema language, so that outputs match what vLLM alone would produce.
    served_backend: str = "xgrammar"
    #: A runtime started earlier for this engine (:func:`start_runtime`, when vLLM built
    #: its structured-output manager); None starts one now.
    prestarted: GrammarRuntime | None = None
    runtime: GrammarRuntime = field(init=False)

    def __post_init__(self) -> None:
        self.runtime = self.prestarted or start_runtime(self.tokenizer, self.vocab_size)
        config = self.vllm_config.structured_outputs_config
        self.any_whitespace = not config.disable_any_whitespace
        # vLLM's xgrammar backend compiles in xgrammar's strict mode (no undeclared
        # properties); its guidance backend follows JSON Schema unless told otherwise.
        self.strict = (self.served_backend == "xgrammar"
                       or bool(config.disable_additional_properties))
        #: Tokens vLLM 0.33's xgrammar backend removes from the vocabulary of every grammar
        #: but structural tags (see :func:`vocabulary_filtered_ids`): blocked in those
        #: grammars' rows and refused by their accept, so that masks match vLLM's.
        self.blocked_ids = (vocabulary_filtered_ids(self.tokenizer, self.vocab_size,
                                                    self.vllm_config.model_config)
                            if self.served_backend == "xgrammar" else frozenset())
        self._keep_row: npt.NDArray[np.int32] | None = None
        if self.blocked_ids:
            keep = np.full(self.runtime.bitmask_words, -1, dtype=np.int32)
            words = keep.view(np.uint32)
            for token_id in self.blocked_ids:
                words[token_id >> 5] &= ~np.uint32(1 << (token_id & 31))
            self._keep_row = keep
        logger.info(
            "portable_guided grammar runtime serves vLLM's %s structured outputs (%d special "
            "tokens outside the vocabulary of non-tag grammars, pid %d)",
            self.served_backend, len(self.blocked_ids), os.getpid(),
        )

    def spec_for(self, request_type: StructuredOutputOptions, grammar_spec: str) -> GrammarSpec:
        """The :class:`GrammarSpec` of one vLLM request (raises ``GrammarSpecError``)."""
        if request_type == StructuredOutputOptions.JSON:
            # The check against the meta-schema (about 1.4 ms of Python for a small schema)
            # runs in the compile job, under its time limit, as the runtime does for large
            # schemas: here it held the GIL against vLLM's engine loop, request after
            # request. A remote $ref is still refused there (never resolved, never fetched).
            if self.served_backend == "xgrammar":
                # xgrammar's strict_mode, as vLLM's backend compiles it: objects naming no
                # properties stay open (`{"type": "object"}` is any object).
                spec = GrammarSpec.json_schema(_xgrammar_strict_text(grammar_spec),
                                               any_whitespace=self.any_whitespace,
                                               validate=False)
            else:
                spec = GrammarSpec.json_schema(grammar_spec, any_whitespace=self.any_whitespace,
                                               strict=self.strict, validate=False)
            return GrammarSpec.from_dict({**spec.to_dict(), "deferred_check": True})
        if request_type == StructuredOutputOptions.JSON_OBJECT:
            return GrammarSpec.any_json(any_whitespace=self.any_whitespace)
        if request_type == StructuredOutputOptions.REGEX:
            return GrammarSpec.regex(grammar_spec)
        if request_type == getattr(StructuredOutputOptions, "CHOICE", None):
            # vLLM 0.33: sent as is by non-Python frontends; its xgrammar backend compiles
            # vLLM's own choice grammar, so do we.
            from vllm.v1.structured_output.utils import choice_as_grammar

            return GrammarSpec.ebnf(choice_as_grammar(json.loads(grammar_spec)))
        if request_type == StructuredOutputOptions.GRAMMAR:
            from vllm.v1.structured_output.utils import grammar_is_likely_lark

            if grammar_is_likely_lark(grammar_spec):
                raise GrammarError("Lark grammars are not served by portable_guided's runtime")
            return GrammarSpec.ebnf(grammar_spec)
        if request_type == StructuredOutputOptions.STRUCTURAL_TAG:
            tag = json.loads(grammar_spec)
            if "structures" not in tag:
                # xgrammar's own format, compiled as vLLM's xgrammar backend compiles it
                # (by xgrammar, as written), in the runtime's workers under its limit.
                return GrammarSpec.xgrammar_structural_tag(tag)
            return GrammarSpec.structural_tag(tag["structures"], tag["triggers"])
        raise GrammarError(f"unsupported structured output type {request_type!s}")

    def _grammar(self, request: Request, request_type: StructuredOutputOptions,
                 ) -> PortableGuidedGrammar:
        if self._keep_row is None or request_type == StructuredOutputOptions.STRUCTURAL_TAG:
            return PortableGuidedGrammar(request)
        return PortableGuidedGrammar(request, self.blocked_ids, self._keep_row)

    def compile_grammar(
        self,
        request_type: StructuredOutputOptions,
        grammar_spec: str,
        stop_token_ids: set[int] | None = None,
    ) -> StructuredOutputGrammar:
        """Compile in the runtime (time-limited, cached); raise to fail this request only.

        Blocks until the compile ends: vLLM's synchronous path. The manager's usual,
        asynchronous path goes through :meth:`compile_grammar_async` instead."""
        request = self.runtime.new_request(self.spec_for(request_type, grammar_spec),
                                           on_error="reject")
        request.wait()
        if request.failed:
            raise request.error  # type: ignore[misc]
        return self._grammar(request, request_type)

    def compile_grammar_async(
        self,
        request_type: StructuredOutputOptions,
        grammar_spec: str,
        request_id: str = "?",
    ) -> Future[StructuredOutputGrammar]:
        """A future of the request's grammar, resolved when the runtime's compile ends (with
        the compile's error if it fails). Returns at once: the spec is built here (cheap:
        a JSON schema's meta-schema check runs in the compile job) and compiled by the
        runtime's workers.

        vLLM runs its own compiles on a thread pool (one thread on two cores); a backend
        waiting there for each compile made a burst of new schemas compile one after the
        other, each handed between threads that all wait for the GIL of a busy engine loop.
        """
        out: Future[StructuredOutputGrammar] = Future()

        def resolved(request: Request) -> None:
            if request.failed:
                error = request.error or GrammarError("the grammar failed to compile")
                logger.error("grammar for request %s failed: %s", request_id, error)
                out.set_exception(error)
            else:
                out.set_result(self._grammar(request, request_type))

        try:
            request = self.runtime.new_request(self.spec_for(request_type, grammar_spec),
                                               on_error="reject")
        except Exception as exc:  # noqa: BLE001 - a bad spec fails its request only
            logger.error("grammar for request %s failed: %s", request_id, exc)
            out.set_exception(exc)
            return out
        request.add_ready_callback(resolved)
        return out

    def allocate_token_bitmask(self, max_num_seqs: int) -> torch.Tensor:
        """All-allowed int32 rows, as a CPU tensor (vLLM slices and copies rows with torch)."""
        return torch.from_numpy(self.runtime.allocate_bitmask(max_num_seqs))

    def destroy(self) -> None:
        """Stop the runtime's compile workers and fill threads."""
        self.runtime.close()


def start_runtime(tokenizer: Any, vocab_size: int) -> GrammarRuntime:
    """The grammar runtime for one vLLM engine, configured from the environment
    (``PORTABLE_GUIDED_VLLM_*``, see the package docs); its compile workers start in the
    background."""
    info = load_tokenizer_info(tokenizer, vocab_size=vocab_size)
    # vLLM gives its own compiles half the cores (its grammar threads), and so do we: on 2
    # cores, a second worker compiling beside the forward stalled torch's OpenMP threads
    # (the first prefill of a burst of new schemas ran 4-7x slower).
    workers = int(os.environ.get("PORTABLE_GUIDED_VLLM_COMPILE_WORKERS",
                                 max(1, min(4, ((os.cpu_count() or 1) + 1) // 2))))
    # The language is vLLM's (xgrammar's strict mode) on every engine; `xgrammar` keeps
    # greedy outputs token-identical to vLLM's own backend (llguidance allows optional
    # whitespace elsewhere: tests/vllm_plugin/test_vllm_e2e.py), `auto` compiles faster.
    engine = os.environ.get("PORTABLE_GUIDED_VLLM_ENGINE", BACKEND_ENGINE)
    timeout_s = env_seconds("PORTABLE_GUIDED_VLLM_COMPILE_TIMEOUT_S", 30.0)
    runtime = GrammarRuntime(
        info,
        engine=engine,
        compile_timeout_s=timeout_s,
        compile_workers=workers,
        # Each compile starts here, as vLLM's own does, and moves to a worker as well only
        # past a quarter second: a new schema's first token as soon as vLLM alone's, the
        # limit kept (docs/latency.md, "compile_race").
        compile_race=os.environ.get("PORTABLE_GUIDED_VLLM_COMPILE_RACE", "1") == "1",
        disk_cache_dir=os.environ.get("PORTABLE_GUIDED_VLLM_CACHE_DIR") or None,
    )
    logger.info("portable_guided grammar runtime started (engine %s, compile limit %s s, "
                "%d compile workers, pid %d)", engine, timeout_s, workers, os.getpid())
    return runtime


class PortableGuidedGrammar(StructuredOutputGrammar):
    """One vLLM request's grammar state: a runtime :class:`Request` with vLLM's semantics.

    ``blocked``/``keep``: tokens outside this grammar's vocabulary (vLLM 0.33 compiles
    non-tag grammars without the special tokens) and the bitmask row that clears them."""

    def __init__(self, request: Request, blocked: frozenset[int] = frozenset(),
                 keep: npt.NDArray[np.int32] | None = None) -> None:
        self.request = request
        self.blocked = blocked
        self.keep = keep

    def accept_tokens(self, request_id: str, tokens: list[int]) -> bool:
        """Advance by ``tokens``; False (state kept) when the grammar rejects one. Tokens
        after the grammar terminated are ignored, as in vLLM's xgrammar backend."""
        for token in tokens:
            if self.request.is_terminated:
                break
            if token in self.blocked or not self.request.accept(token):
                logger.error("grammar rejected token %d for request %s", token, request_id)
                return False
        return True

    def validate_tokens(self, tokens: list[int]) -> list[int]:
        """The longest prefix of ``tokens`` the grammar accepts; the state is unchanged."""
        accepted: list[int] = []
        for token in tokens:
            if (self.request.is_terminated or token in self.blocked
                    or not self.request.accept_tokens([token])):
                break
            accepted.append(token)
        if accepted:
            self.request.rollback(len(accepted))
        return accepted

    def rollback(self, num_tokens: int) -> None:
        """Undo the last ``num_tokens`` accepted tokens."""
        self.request.rollback(num_tokens)

    def fill_bitmask(self, bitmask: torch.Tensor, batch_index: int) -> None:
        """Fill one row (vLLM's per-row path, used with speculative tokens)."""
        self.request.fill(bitmask, batch_index)
        if self.keep is not None:
            bitmask[batch_index] &= torch.from_numpy(self.keep)

    def is_terminated(self) -> bool:
        """True once the grammar accepted a stop token."""
        return self.request.is_terminated

    def reset(self) -> None:
        """Back to the start of the grammar."""
        self.request.rollback(self.request.num_accepted)


def vocabulary_filtered_ids(tokenizer: Any, vocab_size: int, model_config: Any) -> frozenset[int]:
    """The token ids vLLM's own xgrammar backend leaves out of the vocabulary it compiles
    JSON, regex, EBNF and choice grammars with, stop tokens excepted (they still end a
    grammar). vLLM 0.33 removes every special token of a Hugging Face tokenizer (its
    ``XgrammarBackend._filter_special_tokens``, called here, so the set is vLLM's own);
    earlier versions and its Mistral and PLaMo 3 tokenizer paths remove none."""
    from vllm.v1.structured_output.backend_xgrammar import XgrammarBackend

    filter_special = getattr(XgrammarBackend, "_filter_special_tokens", None)
    if filter_special is None:
        return frozenset()
    from vllm.utils.mistral import is_mistral_tokenizer

    model_type = getattr(getattr(model_config, "hf_config", None), "model_type", None)
    if is_mistral_tokenizer(tokenizer) or (
            model_type == "plamo3" and callable(getattr(tokenizer, "init_xgrammar", None))):
        return frozenset()
    import xgrammar as xgr

    full = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
    kept = filter_special(tokenizer, full).decoded_vocab
    stops = set(full.stop_token_ids)
    return frozenset(i for i, text in enumerate(full.decoded_vocab)
                     if text != kept[i] and i not in stops)


def _manager_init(self: StructuredOutputManager, vllm_config: Any) -> None:
    _ORIGINALS["__init__"](self, vllm_config)
    self._portable_guided_runtime = None
    if (getattr(self, "tokenizer", None) is not None
            and vllm_config.structured_outputs_config.backend in ("auto", *SERVED_BACKENDS)):
        # Started with the engine, not at its first structured request, which otherwise
        # waited for the compile worker to start (2-4.5 s here; vLLM's own backend 0.2 s).
        # The backend itself is built at that request, which decides the served backend.
        try:
            self._portable_guided_runtime = start_runtime(
                self.tokenizer, vllm_config.model_config.get_vocab_size())
        except Exception as exc:  # noqa: BLE001 - never stop the engine from starting
            logger.warning("portable_guided could not start its grammar runtime with the "
                           "engine (%s: %s); it will try again at the first structured "
                           "request", type(exc).__name__, exc)


def _grammar_init(self: StructuredOutputManager, request: Any) -> None:
    structured = request.structured_output_request
    if structured is None:
        return
    name = request.sampling_params.structured_outputs._backend
    if self.backend is None and name in SERVED_BACKENDS:
        prestarted = getattr(self, "_portable_guided_runtime", None)
        self._portable_guided_runtime = None  # the backend owns (and closes) it now
        self.backend = PortableGuidedBackend(
            self.vllm_config, tokenizer=self.tokenizer,
            vocab_size=self.vllm_config.model_config.get_vocab_size(), served_backend=name,
            prestarted=prestarted,
        )
        if hasattr(self, "backend_name"):
            # vLLM 0.33: one backend per engine, checked by name in grammar_init (which
            # names the backend only when it builds it itself).
            self.backend_name = name
    if (
        not isinstance(self.backend, PortableGuidedBackend)
        or not getattr(self, "_use_async_grammar_compilation", True)
        or getattr(self, "backend_name", None) not in (None, name)
    ):
        # vLLM's own path: another backend, synchronous compiles, or a request 0.33
        # refuses (one backend per engine: vLLM raises its own error).
        _ORIGINALS["grammar_init"](self, request)
        return
    request_type, grammar_spec = structured.structured_output_key
    structured.grammar = self.backend.compile_grammar_async(
        request_type, grammar_spec, request_id=request.request_id)


def _create_grammar(self: StructuredOutputManager, request: Any) -> StructuredOutputGrammar:
    if not isinstance(self.backend, PortableGuidedBackend):
        return _ORIGINALS["_create_grammar"](self, request)
    request_type, grammar_spec = request.structured_output_request.structured_output_key
    try:
        return self.backend.compile_grammar(request_type, grammar_spec)
    except GrammarError as exc:
        # A bad grammar fails its request only; one line, not a traceback per request.
        logger.error("grammar for request %s failed: %s", request.request_id, exc)
        raise


def _grammar_bitmask(
    self: StructuredOutputManager,
    requests: dict[str, Any],
    structured_output_request_ids: list[str],
    scheduled_spec_decode_tokens: dict[str, list[int]],
) -> npt.NDArray[Any] | None:
    backend = self.backend
    if (
        not isinstance(backend, PortableGuidedBackend)
        or not structured_output_request_ids
        or self.vllm_config.num_speculative_tokens
        or getattr(self.vllm_config.model_config, "is_diffusion", False)
    ):
        # Speculative rows need accept/rollback between rows: vLLM's per-row path does it
        # through PortableGuidedGrammar.
        return _ORIGINALS["grammar_bitmask"](
            self, requests, structured_output_request_ids, scheduled_spec_decode_tokens
        )
    if self._grammar_bitmask is None:
        self._grammar_bitmask = backend.allocate_token_bitmask(
            self.vllm_config.scheduler_config.max_num_seqs
        )
    rows: list[Request | None] = []
    filtered: list[int] = []  # rows of grammars without the special tokens (vLLM 0.33)
    masked_ends: list[tuple[int, tuple[int, ...]]] = []
    masked_reasoning_ends = getattr(self, "_masked_reasoning_ends", None)  # vLLM 0.33
    for index, req_id in enumerate(structured_output_request_ids):
        request = requests[req_id]
        grammar = request.structured_output_request.grammar
        constrained = self._get_constraint_bounds(request, ()).constraint_start == 0
        # vLLM's own rule: a terminated grammar or an unconstrained (reasoning) row is
        # all-allowed; None does exactly that.
        rows.append(grammar.request if constrained and not grammar.is_terminated() else None)
        if rows[-1] is not None and grammar.keep is not None:
            filtered.append(index)
        if not constrained and masked_reasoning_ends is not None:
            # vLLM 0.33: a row still reasoning blocks the implicit reasoning-end tokens its
            # grammar could not start with.
            masked = masked_reasoning_ends(request)
            if masked:
                masked_ends.append((index, masked))
    bitmask = self._grammar_bitmask[: len(rows)].numpy()
    backend.runtime.fill_bitmask(rows, bitmask)
    if filtered:
        bitmask[filtered] &= backend._keep_row
    for index, masked in masked_ends:
        row = bitmask[index].view(np.uint32)
        for token_id in masked:
            row[token_id >> 5] &= ~np.uint32(1 << (token_id & 31))
    return bitmask


_PATCHES = {
    "__init__": _manager_init,
    "grammar_init": _grammar_init,
    "_create_grammar": _create_grammar,
    "grammar_bitmask": _grammar_bitmask,
}


def install_backend() -> None:
    """Make vLLM's structured-output manager use :class:`PortableGuidedBackend`."""
    with _lock:
        if _ORIGINALS:
            return
        for name, ours in _PATCHES.items():
            _ORIGINALS[name] = getattr(StructuredOutputManager, name)
            setattr(StructuredOutputManager, name, ours)
    logger.info("portable_guided will serve structured outputs with its grammar runtime "
                "(pid %d)", os.getpid())


def uninstall_backend() -> None:
    """Restore vLLM's structured-output manager (managers already built keep their backend)."""
    with _lock:
        for name, original in _ORIGINALS.items():
            setattr(StructuredOutputManager, name, original)
        _ORIGINALS.clear()


def _xgrammar_strict_text(text: str) -> str:
    """The JSON schema ``text`` in xgrammar's strict language (text that is not JSON is
    returned as it is: the spec then fails with the parse error)."""
    try:
        schema = json.loads(text)
    except ValueError:
        return text
    return json.dumps(xgrammar_strict_schema(schema), ensure_ascii=False)
