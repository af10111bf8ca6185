"""The runtime backend: our :class:`~portable_guided.runtime.GrammarRuntime` behind lmdeploy's
``GuidedDecodingManager`` (``PORTABLE_GUIDED_LMDEPLOY_BACKEND=1``).

lmdeploy 0.18.0 compiles a request's grammar in ``GuidedDecodingManager.get_processor``,
called from ``FusedLogitsProcessor.__init__`` on the engine's asyncio loop, with no time
limit, and drops xgrammar's ``False`` when a sampled token is rejected. With the backend:

- ``get_processor`` only hands the format to a thread that lowers it (JSON schemas through
  our lowering, in xgrammar's strict language as lmdeploy compiles them; regexes) and
  submits the compile to the runtime's worker processes, which kill a compile at the hard
  limit; the event loop waits for neither. The compile is submitted when the engine admits
  the request (``Engine._add_message``), so it runs while the request waits for its turn and
  during its prefill forward. Where the model agent runs in the engine's process (lmdeploy's
  ``uni`` executor) it goes to the agent's manager; with the multi-process executors (``mp``,
  ``ray``), where each rank's manager is in a process of its own, the engine's process
  compiles it into the disk cache the ranks share (``PORTABLE_GUIDED_LMDEPLOY_CACHE_DIR``;
  :mod:`.prefetch`), and without that directory the ranks compile at the first sampling
  step;
- the fill (``FusedLogitsProcessor._fill_guided_bitmask``, which lmdeploy runs in a thread
  with ``asyncio.to_thread``) waits for compiles still running, then fills every row of ours
  with one batched runtime call;
- a schema the runtime refuses, that fails or that passes the limit fails its request alone:
  its row allows only the stop tokens, so that sequence ends and the others go on;
- a token the grammar rejects fails its request (fail closed, the runtime's ``terminate``
  policy): its later rows allow only the stop tokens;
- speculative verification (``GuidedSpecHelper.apply_serial_bitmask``) fills the masks of
  every draft position of a request with one ``Request.fill_draft_masks`` call (the drafts
  accepted tentatively and rolled back) instead of forking; the draft side's ``fork()`` is a
  :class:`DraftFork`, whose rows come from ``fill_draft_masks`` on the original request
  (nothing copied or replayed).

Structural tags of triggered tool calls (xgrammar's ``triggered_tags`` around JSON schemas,
without ``at_least_one``, ``stop_after_first`` or ``excludes``) are compiled in the runtime's
language on any engine; every other structural-tag format is compiled by xgrammar as written
(lmdeploy's own compile), in the runtime's workers under its limit.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import numpy as np

from .._settings import env_seconds
from .prefetch import CACHE_DIR_ENV, Prefetch

__all__ = ["DraftFork", "Processor", "admission", "batched_fill", "manager_methods",
           "serial_bitmask", "spec_for"]

logger = logging.getLogger("lmdeploy.plugins.portable_guided")


def spec_for(response_format: Mapping[str, Any]) -> Any:
    """The runtime's :class:`~portable_guided.runtime.GrammarSpec` for one lmdeploy
    ``response_format``. Structural tags :func:`_triggered_tags` reads are compiled in the
    runtime's language on any engine; every other structural tag is handed to xgrammar as
    written (``GrammarSpec.xgrammar_structural_tag``: lmdeploy's own compile, under the
    runtime's limit and off the loop). Raises the spec error (``GrammarError``,
    ``ValueError``) of a bad format."""
    from lmdeploy._guided_decoding import _grammar_source

    from ...runtime import GrammarSpec

    kind, source = _grammar_source(dict(response_format))
    if kind == "json_schema":
        return GrammarSpec.json_schema(_strict_text(source))
    if kind == "regex_schema":
        return GrammarSpec.regex(source)
    tags = _triggered_tags(response_format) if kind == "structural_tag" else None
    if tags is not None:
        return GrammarSpec.structural_tag(
            [{"begin": begin, "schema": json.loads(_strict_text(json.dumps(schema))),
              "end": end} for begin, schema, end in tags[0]], tags[1])
    if kind == "structural_tag":
        return GrammarSpec.xgrammar_structural_tag(source)
    raise ValueError(f"unsupported format type: {kind}")


def _served(response_format: Mapping[str, Any]) -> bool:
    """Whether the runtime takes this format: anything but free text."""
    return response_format.get("type", "text") != "text"


def _triggered_tags(response_format: Mapping[str, Any],
                    ) -> tuple[list[tuple[str, Any, str]], list[str]] | None:
    """``([(begin, schema, end), ...], triggers)`` of a structural tag the runtime serves:
    xgrammar's ``triggered_tags`` format with plain string tags around JSON schemas, no
    ``at_least_one``, ``stop_after_first`` or ``excludes`` (the language of the runtime's
    ``structural_tag``, and of xgrammar's legacy form it converts from), or the legacy
    ``structures``/``triggers`` form itself. None for anything else, which xgrammar
    compiles as written (:func:`spec_for`)."""
    if response_format.get("type") != "structural_tag":
        return None
    if "format" not in response_format:
        structures, triggers = response_format.get("structures"), response_format.get(
            "triggers")
        if not isinstance(structures, list) or not isinstance(triggers, list):
            return None
        try:
            return [(s["begin"], s["schema"], s["end"]) for s in structures], triggers
        except (KeyError, TypeError):
            return None
    fmt = response_format["format"]
    if (not isinstance(fmt, dict) or fmt.get("type") != "triggered_tags"
            or fmt.get("at_least_one") or fmt.get("stop_after_first") or fmt.get("excludes")
            or not isinstance(fmt.get("triggers"), list)
            or not isinstance(fmt.get("tags"), list)):
        return None
    tags = []
    for tag in fmt["tags"]:
        content = tag.get("content") if isinstance(tag, dict) else None
        if (not isinstance(content, dict) or tag.get("type", "tag") != "tag"
                or content.get("type") != "json_schema"
                or content.get("style", "json") != "json"
                or not isinstance(tag.get("begin"), str) or not isinstance(tag.get("end"), str)):
            return None
        tags.append((tag["begin"], content.get("json_schema"), tag["end"]))
    return tags, fmt["triggers"]


def _strict_text(source: str) -> str:
    """A JSON schema's text in xgrammar's strict reading, as lmdeploy compiles it."""
    from ...json_schema.strict import xgrammar_strict_schema

    try:
        return json.dumps(xgrammar_strict_schema(json.loads(source)), ensure_ascii=False)
    except (ValueError, RecursionError):
        return source  # not JSON, or too deep: GrammarSpec says which


class Processor:
    """One sequence's grammar (what lmdeploy calls a processor): a runtime request, or the
    error that failed it. Made on the event loop without waiting: the format's lowering and
    the compile's submission run in the manager's spec thread (a deep schema's lowering alone
    can take a second), the compile in the runtime's workers; lmdeploy's fill thread waits
    for both (:meth:`wait`)."""

    def __init__(self, manager: Any, pending: Future[tuple[Any, Any]],
                 tokens: list[int] | None = None) -> None:
        self.manager = manager
        self._pending = pending
        self.tokens: list[int] = tokens or []
        self.reported = False

    @classmethod
    def submit(cls, manager: Any, response_format: Mapping[str, Any]) -> Processor:
        """Lower ``response_format`` and submit its compile, in the manager's spec thread."""
        def build() -> tuple[Any, Any]:
            spec = spec_for(response_format)
            return spec, manager._pg_runtime.new_request(spec, on_error="terminate")

        return cls(manager, manager._pg_specs.submit(build))

    @property
    def runtime(self) -> Any:
        """The manager's grammar runtime."""
        return self.manager._pg_runtime

    def _built(self) -> tuple[Any, Any] | None:
        """(spec, request) once lowered and submitted, else None (lowering, or failed)."""
        if not self._pending.done() or self._pending.exception() is not None:
            return None
        return self._pending.result()

    @property
    def spec(self) -> Any:
        """The format's runtime spec (None while lowering, or when the format failed)."""
        built = self._built()
        return None if built is None else built[0]

    @property
    def request(self) -> Any:
        """The runtime request (None while lowering, or when the format failed)."""
        built = self._built()
        return None if built is None else built[1]

    @property
    def error(self) -> BaseException | None:
        """Why this request failed, or None."""
        if not self._pending.done():
            return None
        if self._pending.exception() is not None:
            return self._pending.exception()
        request = self._pending.result()[1]
        return request.error if request.failed else None

    def wait(self) -> None:
        """Wait (in lmdeploy's fill thread) for the lowering and the compile; the runtime
        fails a compile at its hard limit, so this ends by then."""
        limit = self.manager._pg_wait_s
        try:
            _, request = self._pending.result(limit)
        except FutureTimeout:
            raise RuntimeError(f"portable_guided: a response format was not lowered in "
                               f"{limit} s") from None
        except Exception:  # noqa: BLE001 - reported below; the request fails alone
            request = None
        if request is not None and not request.ready:
            request.wait(limit)
            if not request.ready:  # the runtime keeps its own limit; say so, go on
                logger.error("portable_guided: a compile did not finish in %s s", limit)
        self.report()

    def report(self) -> None:
        """Log a failed request once (with the reason)."""
        failed = self.error
        if failed is not None and not self.reported:
            self.reported = True
            logger.error("portable_guided fails one guided request (its row allows only the "
                         "stop tokens from now on): %s: %s", type(failed).__name__, failed)

    def fill(self, bitmask: Any, row: int) -> None:
        """Fill ``bitmask[row]`` (lmdeploy's per-row path)."""
        self.wait()
        request = self.request
        if request is None:
            rows = self.runtime.special_rows
            rows.write(bitmask, row, rows.stop_only)
        else:
            request.fill(bitmask, row)

    def accept(self, token: int) -> None:
        """Advance by ``token``; a token the grammar rejects fails the request."""
        self.wait()
        request = self.request
        if request is None:
            return
        self.tokens.append(int(token))
        failed_before, rejected_before = request.failed, request.num_rejected
        if (not request.accept(int(token)) and not failed_before
                and request.num_rejected > rejected_before == 0):
            logger.error("portable_guided: the grammar rejected token %d (position %d); the "
                         "request fails closed (only stop tokens from now on)", int(token),
                         len(self.tokens) - 1)

    @property
    def terminated(self) -> bool:
        """True once the grammar accepted a stop token (not when it failed: a failed
        request's row keeps allowing only the stop tokens)."""
        request = self.request
        return request is not None and bool(request.is_terminated)

    def fork(self) -> Processor:
        """A copy in the same state, for the speculative draft side (lmdeploy's spec agent
        forks before drafting): a :class:`DraftFork` on this request, nothing copied."""
        return DraftFork(self, [], len(self.tokens))


class DraftFork(Processor):
    """A fork of a :class:`Processor` for the draft side: the original's request and draft
    tokens of its own. Its row is the original's mask after those drafts, from
    ``Request.fill_draft_masks`` (accepted tentatively, then rolled back), so forking costs
    nothing, however long the output (a copied request would replay every token). A draft
    the grammar refuses is skipped, as an xgrammar matcher's fork skips it.

    A fork is valid while its original does not advance (lmdeploy's spec agent forks each
    step before drafting and drops the forks before the originals accept); used after that,
    it raises rather than answer from the wrong state."""

    def __init__(self, base: Processor, drafts: list[int], at: int) -> None:
        super().__init__(base.manager, base._pending, base.tokens)
        self.reported = True  # the original reports a failure, once
        self.base = base
        self.drafts = drafts  # the accepted ones only
        self._at = at  # the original's position when forked
        self._row: np.ndarray | None = None  # the mask after them, once computed

    def _mask(self) -> np.ndarray | None:
        """The mask after the drafts (None without a compiled grammar)."""
        if len(self.base.tokens) != self._at:
            raise RuntimeError(
                f"portable_guided: a draft fork taken at token {self._at} was used after its "
                f"original advanced to token {len(self.base.tokens)}")
        self.wait()
        request = self.request
        if request is None:
            return None
        if self._row is None:
            k = len(self.drafts)
            scratch = np.empty((k + 1, self.runtime.special_rows.words), dtype=np.int32)
            request.fill_draft_masks(self.drafts, scratch)
            self._row = scratch[k]
        return self._row

    def fill(self, bitmask: Any, row: int) -> None:
        mask = self._mask()
        if mask is None or not self.drafts:
            super().fill(bitmask, row)
        elif isinstance(bitmask, np.ndarray):
            bitmask[row] = mask
        else:  # lmdeploy's Torch bitmask
            import torch

            bitmask[row] = torch.from_numpy(mask)

    def accept(self, token: int) -> None:
        mask = self._mask()
        token = int(token)
        if mask is not None and 0 <= token < 32 * mask.shape[0] and (
                int(mask[token >> 5]) >> (token & 31)) & 1:
            self.drafts.append(token)
            self._row = None

    @property
    def terminated(self) -> bool:
        return self.base.terminated

    def fork(self) -> Processor:
        return DraftFork(self.base, list(self.drafts), self._at)


def warm(runtime: Any) -> None:
    """Build the runtime's engines while the engine starts (``GrammarRuntime.warm``), not
    while its event loop serves; a failure is left for the first compile to report."""
    try:
        runtime.warm()
    except Exception as exc:  # noqa: BLE001 - never stop the engine from starting
        logger.warning("portable_guided could not build its grammar engines ahead (%s: %s)",
                       type(exc).__name__, exc)


#: The grammar engine unless ``PORTABLE_GUIDED_LMDEPLOY_ENGINE`` names another: the
#: runtime's default, chosen by measurement (docs/latency.md). The language is lmdeploy's
#: (xgrammar's strict mode) on every engine; ``xgrammar`` keeps masks equal to lmdeploy's own.
BACKEND_ENGINE = "auto"


def _runtime_for(manager: Any, tokenizer: Any) -> Any:
    from ...runtime import GrammarRuntime, load_tokenizer_info

    # The tokenizer's end tokens, as xgrammar's ``TokenizerInfo.from_huggingface`` (lmdeploy's
    # manager) finds them.
    info = load_tokenizer_info(tokenizer, vocab_size=int(manager.vocab_size))
    timeout_s = env_seconds("PORTABLE_GUIDED_LMDEPLOY_COMPILE_TIMEOUT_S", 30.0)
    workers = int(os.environ.get("PORTABLE_GUIDED_LMDEPLOY_COMPILE_WORKERS",
                                 max(1, min(4, ((os.cpu_count() or 1) + 1) // 2))))
    engine = os.environ.get("PORTABLE_GUIDED_LMDEPLOY_ENGINE", BACKEND_ENGINE)
    runtime = GrammarRuntime(info, engine=engine, compile_timeout_s=timeout_s,
                             compile_workers=workers,
                             disk_cache_dir=os.environ.get(CACHE_DIR_ENV)
                             or None)
    manager._pg_wait_s = None if timeout_s is None else 1.5 * timeout_s + 5.0
    warm(runtime)
    logger.info("portable_guided grammar runtime serves lmdeploy's guided decoding (engine "
                "%s, compile limit %s s, %d compile workers, pid %d)", engine, timeout_s,
                workers, os.getpid())
    return runtime


def manager_methods(original: Mapping[str, Any]) -> dict[str, Callable[..., Any]]:
    """Our ``GuidedDecodingManager`` methods, given lmdeploy's (the class ``__dict__``);
    xgrammar matchers (other structural tags) keep lmdeploy's own."""
    init = original["__init__"]
    get_processor = original["get_processor"]
    fill_bitmap = original["fill_bitmap"]
    accept_token = original["accept_token"]
    is_terminated = original["is_terminated"]

    def __init__(self: Any, tokenizer: Any, vocab_size: int | None) -> None:
        init(self, tokenizer, vocab_size)
        self._pg_runtime = _runtime_for(self, tokenizer)
        # Lowering a deep schema is Python work that can take a second: one thread, in
        # admission order, never the event loop.
        self._pg_specs = ThreadPoolExecutor(1, thread_name_prefix="pg-lmdeploy-spec")

    def get_processor_(self: Any, session_id: int, seq_id: int,
                       response_format: dict[str, Any]) -> Any:
        known = self.processors.get(session_id, {}).get(seq_id)
        if known is not None:
            return known
        if not _served(response_format):  # (free text: lmdeploy asks for none)
            return get_processor(self, session_id, seq_id, response_format)
        processor = Processor.submit(self, response_format)
        self.processors.setdefault(session_id, {})[seq_id] = processor
        return processor

    def fill_bitmap_(self: Any, processor: Any, guided_bitmask: Any, index: int) -> None:
        if isinstance(processor, Processor):
            processor.fill(guided_bitmask, index)
        else:
            fill_bitmap(self, processor, guided_bitmask, index)

    def accept_token_(self: Any, processor: Any, token: int) -> None:
        if isinstance(processor, Processor):
            processor.accept(token)
        else:
            accept_token(self, processor, token)

    def is_terminated_(self: Any, processor: Any) -> bool:
        if isinstance(processor, Processor):
            return processor.terminated
        return bool(is_terminated(self, processor))

    return {"__init__": __init__, "get_processor": get_processor_, "fill_bitmap": fill_bitmap_,
            "accept_token": accept_token_, "is_terminated": is_terminated_}


def admission(original: Callable[..., Any]) -> Callable[..., Any]:
    """``Engine._add_message`` that also submits the compile of each admitted request's
    grammar (without waiting): to the model agent's ``GuidedDecodingManager`` where it is in
    this process (:meth:`Processor.submit`); where the agents run in other processes (the
    ``mp`` and ``ray`` executors) and a shared disk cache is set, into that cache
    (:class:`~.prefetch.Prefetch`). A failure here is logged and leaves the request to the
    sampling step, which reports it."""
    def _add_message(self: Any, reqs: list[Any]) -> None:
        original(self, reqs)
        agent = getattr(getattr(self, "executor", None), "model_agent", None)
        manager: Any = getattr(agent, "guided_decoding_manager", None)
        prefetch: Prefetch | None = None
        if manager is None and Prefetch.wanted(self):
            prefetch = getattr(self, "_pg_prefetch", None)
            if prefetch is None:
                prefetch = self._pg_prefetch = Prefetch(self.model_config, _runtime_for,
                                                        spec_for)
        elif manager is None or getattr(manager, "_pg_runtime", None) is None:
            return
        for req in reqs:
            try:
                data = req.data
                fmt = getattr(data.get("sampling_param"), "response_format", None)
                if not isinstance(fmt, dict) or not _served(fmt):
                    continue
                if prefetch is not None:
                    prefetch.submit(fmt)
                    continue
                session = self.scheduler.get_session(data["session_id"])
                for seq in ([] if session is None else list(session.sequences.values())):
                    manager.get_processor(data["session_id"], seq.seq_id, fmt)
            except Exception as exc:  # noqa: BLE001 - admission must go on
                logger.warning("portable_guided could not submit a compile at admission "
                               "(%s: %s); it starts at the first sampling step",
                               type(exc).__name__, exc)

    return _add_message


def batched_fill(original: Callable[..., Any]) -> Callable[..., Any]:
    """``FusedLogitsProcessor._fill_guided_bitmask`` with one batched runtime fill for the
    rows of our processors (lmdeploy runs it in a thread): compiles still running are waited
    for first; rows of xgrammar matchers are filled one by one as lmdeploy does."""

    def _fill_guided_bitmask(self: Any, guided_bitmask: Any) -> None:
        manager = self.guided_decoding_manager
        runtime = getattr(manager, "_pg_runtime", None)
        if runtime is None:
            original(self, guided_bitmask)
            return
        guided_bitmask.data.fill_(-1)
        requests: list[Any] = []
        rows: list[int] = []
        for index, processor in self.guided_processors.items():
            if isinstance(processor, Processor):
                processor.wait()
                if processor.request is None:
                    processor.fill(guided_bitmask, index)
                else:
                    requests.append(processor.request)
                    rows.append(index)
            elif not manager.is_terminated(processor):
                manager.fill_bitmap(processor, guided_bitmask, index)
        if requests:
            runtime.fill_bitmask(requests, guided_bitmask, rows=rows)

    return _fill_guided_bitmask


def serial_bitmask(original: Callable[..., Any]) -> Callable[..., Any]:
    """``GuidedSpecHelper.apply_serial_bitmask`` for our processors: the masks of all
    ``num_expand`` positions of a request from one ``Request.fill_draft_masks``, in one
    thread hop, then applied position by position as lmdeploy does. Positions past a draft
    the grammar refuses get the mask where it was refused (lmdeploy's forks skip that draft
    and go on with the next ones): rejection sampling discards them either way, since the
    masked target gives a refused draft probability 0, so it and every later draft are
    rejected. A batch with an xgrammar matcher (another structural tag) keeps lmdeploy's
    own."""
    import torch

    async def apply_serial_bitmask(self: Any, scores_3d: Any, processors: dict[int, Any],
                                   draft_token_ids: Any, num_spec_tokens: int) -> None:
        manager = self.manager
        if (not processors or manager is None
                or not all(isinstance(p, Processor) for p in processors.values())):
            await original(self, scores_3d, processors, draft_token_ids, num_spec_tokens)
            return
        batch, num_expand = int(scores_3d.size(0)), int(scores_3d.size(1))
        drafts = draft_token_ids.cpu().tolist()
        k = max(0, min(int(num_spec_tokens), num_expand - 1))
        bitmask = _serial_buffer(manager, batch * num_expand)

        def fill() -> None:
            bitmask.fill_(-1)
            for idx, processor in processors.items():
                if processor.terminated:  # lmdeploy does not fork these: rows left free
                    continue
                processor.wait()
                start = idx * num_expand
                request = processor.request
                if request is None:  # the format failed: its rows allow only stop tokens
                    for pos in range(num_expand):
                        processor.fill(bitmask, start + pos)
                    continue
                request.fill_draft_masks(drafts[idx][:k], bitmask, start)
                for pos in range(k + 1, num_expand):  # no draft left to accept
                    bitmask[start + pos] = bitmask[start + k]

        await asyncio.to_thread(fill)
        masks = bitmask.view(batch, num_expand, -1)
        with torch.inference_mode():  # the scores are inference-mode tensors
            for pos in range(num_expand):
                manager.apply_batched_bitmap(scores_3d[:, pos, :], masks[:, pos, :].contiguous())

    return apply_serial_bitmask


def _serial_buffer(manager: Any, rows: int) -> Any:
    """The manager's bitmask for verification steps, ``rows`` rows (grown as needed, reused:
    allocating it cost more than filling it). The spec agent awaits one step at a time."""
    import torch

    buffer = getattr(manager, "_pg_serial_buffer", None)
    if buffer is None or buffer.shape[0] < rows:
        words = manager._pg_runtime.special_rows.words
        buffer = torch.empty((rows, words), dtype=torch.int32)
        manager._pg_serial_buffer = buffer
    return buffer[:rows]
