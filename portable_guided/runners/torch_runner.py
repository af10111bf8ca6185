"""SmolLM2 with PyTorch ops: a Llama forward over a slot-based KV cache, plus the device ops of
the :class:`portable_guided.decode.device.Runner` protocol.

The weights are the ``transformers`` model's own tensors (see :mod:`.weights`); the forward is
written here rather than calling ``model(...)`` so that every row keeps its own cache length
(continuous batching, speculative rollback) and so that it mirrors the Paddle forward op for op.
``tests/runners/test_torch_runner.py`` checks it against ``transformers``' forward.

On CUDA, bitmask uploads and sampled-token downloads run on a side stream from page-locked
host memory and are ordered with the compute stream by events; nothing in a step calls a
device-wide synchronize.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from portable_guided.decode.device import (
    Pending,
    Ready,
    SamplingParams,
    SlotLengths,
    tree_layout,
)
from portable_guided.runners.weights import (
    LlamaSpec,
    load_folder,
    load_hf_model,
    load_tokenizer,
    random_weights,
)

__all__ = ["TorchLlama", "TorchRunner"]


def _device(name: str | None) -> torch.device:
    """``name``, or CUDA when there is one, else the CPU."""
    return torch.device(name or ("cuda" if torch.cuda.is_available() else "cpu"))


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    var = x.pow(2).mean(-1, keepdim=True)
    return x * torch.rsqrt(var + eps) * weight


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class TorchLlama:
    """A Llama decoder over a KV cache laid out ``[slot * max_len + position, kv_head, dim]``.

    Writing a token's keys is one ``index_copy_`` per layer and reading a batch's keys one
    ``index_select``, whatever the mix of cache lengths.
    """

    def __init__(
        self, spec: LlamaSpec, weights: dict[str, torch.Tensor], device: torch.device
    ) -> None:
        self.spec = spec
        self.device = device
        w = {k: v.to(device=device, dtype=torch.float32) for k, v in weights.items()}
        self.embed = w["model.embed_tokens.weight"]
        self.lm_head = self.embed if spec.tie_embeddings else w["lm_head.weight"]
        self.final_norm = w["model.norm.weight"]
        self.layers = []
        for i in range(spec.num_layers):
            p = f"model.layers.{i}."
            qkv = torch.cat(
                [w[p + f"self_attn.{n}_proj.weight"] for n in ("q", "k", "v")], dim=0
            )
            gate_up = torch.cat([w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"]], 0)
            self.layers.append(
                (
                    w[p + "input_layernorm.weight"],
                    qkv.t().contiguous(),
                    w[p + "self_attn.o_proj.weight"].t().contiguous(),
                    w[p + "post_attention_layernorm.weight"],
                    gate_up.t().contiguous(),
                    w[p + "mlp.down_proj.weight"].t().contiguous(),
                )
            )
        d = spec.head_dim
        self.inv_freq = 1.0 / (
            spec.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float32, device=device) / d)
        )
        self.k_cache: list[torch.Tensor] = []
        self.v_cache: list[torch.Tensor] = []
        self.max_len = 0

    def allocate(self, max_slots: int, max_len: int) -> None:
        """Allocate (zeroed) caches for ``max_slots`` x ``max_len`` tokens."""
        s = self.spec
        shape = (max_slots * max_len, s.num_kv_heads, s.head_dim)
        self.k_cache = [torch.zeros(shape, device=self.device) for _ in range(s.num_layers)]
        self.v_cache = [torch.zeros(shape, device=self.device) for _ in range(s.num_layers)]
        self.max_len = max_len

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        slots: torch.Tensor,
        starts: torch.Tensor,
        key_len: int,
        out_rows: torch.Tensor | None,
        tree: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Logits for ``input_ids`` ``[B, T]`` appended at ``starts`` ``[B]`` of ``slots`` ``[B]``.

        ``key_len`` is ``max(starts + T)`` (a host int, so no device read-back); ``out_rows``
        selects rows of the flattened ``[B*T]`` positions to project to the vocabulary
        (``None``: all). ``tree`` is ``(depth, ancestors)`` from
        :func:`~portable_guided.decode.device.tree_layout`: token ``j`` is stored at
        ``starts + j`` but rotated at ``starts + depth[j]`` and sees only its ancestors.
        """
        s = self.spec
        b, t = input_ids.shape
        kv, g, d = s.num_kv_heads, s.num_heads // s.num_kv_heads, s.head_dim
        steps = torch.arange(t, device=self.device)
        stored = starts[:, None] + steps[None, :]  # [B, T] cache positions
        write_idx = (slots[:, None] * self.max_len + stored).reshape(-1)
        read_idx = (
            slots[:, None] * self.max_len + torch.arange(key_len, device=self.device)[None, :]
        ).reshape(-1)
        keys_pos = torch.arange(key_len, device=self.device)
        if tree is None:
            pos = stored
            allowed = keys_pos[None, None, :] <= pos[:, :, None]  # [B, T, L]
        else:
            depth, ancestors = tree
            pos = starts[:, None] + depth
            rel = keys_pos[None, :] - starts[:, None]  # [B, L]: key's index in the tree
            in_tree = (rel >= 0) & (rel < t)
            idx = rel.clamp(0, t - 1)[:, None, :].expand(b, t, key_len)
            allowed = (rel < 0)[:, None, :] | (ancestors.gather(2, idx) & in_tree[:, None, :])
        bias = torch.zeros(allowed.shape, device=self.device).masked_fill_(~allowed, float("-inf"))
        bias = bias[:, None, None]  # [B, 1, 1, T, L]
        freqs = pos[..., None].float() * self.inv_freq  # [B, T, D/2]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos()[:, :, None], emb.sin()[:, :, None]  # [B, T, 1, D]
        scale = d**-0.5

        x = self.embed[input_ids]  # [B, T, H]
        for layer, (ln1, w_qkv, w_o, ln2, w_gu, w_down) in enumerate(self.layers):
            h = _rms_norm(x, ln1, s.rms_eps)
            qkv = h @ w_qkv
            q, k, v = qkv.split([s.num_heads * d, kv * d, kv * d], dim=-1)
            q = q.view(b, t, s.num_heads, d)
            k = k.view(b, t, kv, d)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            kc, vc = self.k_cache[layer], self.v_cache[layer]
            kc.index_copy_(0, write_idx, k.reshape(-1, kv, d))
            vc.index_copy_(0, write_idx, v.reshape(-1, kv, d))
            keys = kc.index_select(0, read_idx).view(b, key_len, kv, d).permute(0, 2, 1, 3)
            vals = vc.index_select(0, read_idx).view(b, key_len, kv, d).permute(0, 2, 1, 3)
            qh = q.view(b, t, kv, g, d).permute(0, 2, 3, 1, 4)  # [B, KV, G, T, D]
            scores = (qh @ keys[:, :, None].transpose(-1, -2)) * scale + bias
            attn = torch.softmax(scores, dim=-1) @ vals[:, :, None]  # [B, KV, G, T, D]
            x = x + attn.permute(0, 3, 1, 2, 4).reshape(b, t, s.num_heads * d) @ w_o
            h = _rms_norm(x, ln2, s.rms_eps)
            gate, up = (h @ w_gu).chunk(2, dim=-1)
            x = x + (torch.nn.functional.silu(gate) * up) @ w_down
        x = x.reshape(b * t, -1)
        if out_rows is not None:
            x = x.index_select(0, out_rows)
        return _rms_norm(x, self.final_norm, s.rms_eps) @ self.lm_head.t()


class _HostCopy:
    """A device-to-host token copy on a side stream, completed by an event."""

    __slots__ = ("_event", "_host")

    def __init__(self, event: torch.cuda.Event, host: torch.Tensor) -> None:
        self._event, self._host = event, host

    def wait(self) -> np.ndarray:
        self._event.synchronize()
        return self._host.numpy()


class TorchRunner(SlotLengths):
    """The PyTorch runner: :class:`TorchLlama` plus the decode loop's device operations.

    Example::

        runner = TorchRunner.from_pretrained()
        from portable_guided.decode import Generator, GenerationRequest
        outs = Generator(runner).generate([GenerationRequest(prompt_ids=[1, 2, 3], max_tokens=8)])
    """

    framework = "torch"

    def __init__(self, model: TorchLlama, tokenizer: Any = None) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.device = model.device
        self.vocab_size = model.spec.vocab_size
        self.eos_token_id = model.spec.eos_token_id
        self._lengths: dict[int, int] = {}
        self._cuda = self.device.type == "cuda"
        #: Overlap grammar work with the forward only when the forward is not on these cores.
        self.prefers_overlap = self.device.type != "cpu"
        self._side = torch.cuda.Stream(self.device) if self._cuda else None
        self._upload_events: dict[int, torch.cuda.Event] = {}
        self._generator: torch.Generator | None = None
        self._seed: int | None = None

    @classmethod
    def from_pretrained(cls, device: str | None = None) -> TorchRunner:
        """Load SmolLM2 (once per process) onto ``device`` (default: CUDA if available)."""
        hf = load_hf_model()
        spec = LlamaSpec.from_hf_config(hf.config)
        dev = _device(device)
        weights = {
            k: v for k, v in hf.state_dict().items()
            if not (spec.tie_embeddings and k == "lm_head.weight")
        }
        return cls(TorchLlama(spec, weights, dev), load_tokenizer())

    @classmethod
    def with_random_weights(
        cls, folder: str, device: str | None = None, seed: int = 0
    ) -> TorchRunner:
        """The model of a Hugging Face folder's ``config.json`` and tokenizer with
        :func:`~portable_guided.runners.weights.random_weights`: the real forward's cost and
        device mechanics where the GGUF weights cannot be brought (not the model's tokens)."""
        spec, tokenizer = load_folder(folder)
        weights = {k: torch.from_numpy(v) for k, v in random_weights(spec, seed).items()}
        return cls(TorchLlama(spec, weights, _device(device)), tokenizer)

    # -- KV cache -------------------------------------------------------------------------
    def reset(self, max_slots: int, max_len: int) -> None:
        """See :meth:`Runner.reset`."""
        self.model.allocate(max_slots, max_len)
        self._lengths = {}
        self._seed = None  # sampling restarts from its seed


    def forward(
        self,
        slots: Sequence[int],
        tokens: Any,
        counts: Sequence[int] | None = None,
        *,
        all_positions: bool = False,
        parents: Sequence[Sequence[int]] | None = None,
    ) -> torch.Tensor:
        """See :meth:`Runner.forward`."""
        if isinstance(tokens, torch.Tensor):
            ids = tokens.to(self.device).view(-1, 1)
        else:
            ids = self._upload(np.asarray(tokens, dtype=np.int64))
            if ids.dim() != 2:
                raise ValueError(f"host tokens must be 2-D [batch, steps], got shape {tuple(ids.shape)}")
        b, t = ids.shape
        if b != len(slots):
            raise ValueError(f"{len(slots)} slots for {b} token rows")
        counts = [t] * b if counts is None else list(counts)
        starts = [self._lengths.get(s, 0) for s in slots]
        key_len = max(st + t for st in starts)
        if key_len > self.model.max_len:
            raise ValueError(f"sequence length {key_len} exceeds the cache's {self.model.max_len}")
        tree = None
        if parents is not None:
            depth, ancestors = tree_layout(parents, counts, t)
            tree = (self._upload(depth), self._upload(ancestors))
        if all_positions or tree is not None:
            rows = [i * t + j for i, c in enumerate(counts) for j in range(c)]
        else:
            rows = [i * t + c - 1 for i, c in enumerate(counts)]
        logits = self.model.forward(
            ids,
            self._upload(list(slots)),
            self._upload(starts),
            key_len,
            None if rows == list(range(b * t)) else self._upload(rows),
            tree,
        )
        for s, st, c in zip(slots, starts, counts):
            self._lengths[s] = st + c
        return logits

    def _move_cache_rows(self, slot: int, src: list[int], dst: list[int]) -> None:
        base = slot * self.model.max_len
        src_t = self._upload([base + p for p in src])
        dst_t = self._upload([base + p for p in dst])
        for cache in (*self.model.k_cache, *self.model.v_cache):
            cache.index_copy_(0, dst_t, cache.index_select(0, src_t))

    def _upload(self, values: Any) -> torch.Tensor:
        """Host values (a list or array) on the device without blocking the host.

        A plain ``torch.as_tensor(..., device="cuda")`` copies from pageable memory, which
        waits for the device (two such waits per decode step, found with torch's sync debug
        mode on an H200). Pinned memory from torch's caching host allocator is not reused
        before its copy has run, so the source stays valid.
        """
        if not self._cuda:
            return torch.as_tensor(values, device=self.device)
        host = torch.as_tensor(values)
        return host.pin_memory().to(self.device, non_blocking=True)

    # -- device ops -----------------------------------------------------------------------
    def host_buffer(self, shape: tuple[int, ...]) -> np.ndarray:
        """See :meth:`Runner.host_buffer` (pinned on CUDA)."""
        buf = torch.empty(shape, dtype=torch.int32, pin_memory=self._cuda)
        return buf.numpy()

    def upload_bitmask(self, host_bitmask: np.ndarray) -> torch.Tensor:
        """See :meth:`Runner.upload_bitmask`: side-stream copy, compute stream waits on it."""
        src = torch.from_numpy(host_bitmask)
        if not self._cuda:
            return src
        compute = torch.cuda.current_stream(self.device)
        with torch.cuda.stream(self._side):
            dev = src.to(self.device, non_blocking=True)
            event = torch.cuda.Event()
            event.record(self._side)
        compute.wait_event(event)
        dev.record_stream(compute)
        self._upload_events[host_bitmask.ctypes.data] = event
        return dev

    def host_bitmask_ready(self, host_bitmask: np.ndarray) -> None:
        """See :meth:`Runner.host_bitmask_ready`."""
        event = self._upload_events.pop(host_bitmask.ctypes.data, None)
        if event is not None:
            event.synchronize()

    def apply_mask(self, logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
        """See :meth:`Runner.apply_mask` (``portable_guided.apply_token_mask``)."""
        from portable_guided import apply_token_mask

        return apply_token_mask(logits, bitmask, vocab_size=self.vocab_size)

    def sample(self, logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
        """See :meth:`Runner.sample`."""
        if params.greedy:
            return logits.argmax(dim=-1)
        if self._generator is None or self._seed != params.seed:
            self._generator = torch.Generator(device=self.device).manual_seed(params.seed)
            self._seed = params.seed
        probs = torch.softmax(logits.float() / params.temperature, dim=-1)
        if params.top_p < 1.0:
            sorted_p, order = probs.sort(dim=-1, descending=True)
            drop = (sorted_p.cumsum(-1) - sorted_p) >= params.top_p
            sorted_p = sorted_p.masked_fill(drop, 0.0)
            probs = torch.zeros_like(probs).scatter_(-1, order, sorted_p)
        return torch.multinomial(probs, 1, generator=self._generator).view(-1)

    def select(self, tokens: torch.Tensor, rows: Sequence[int]) -> torch.Tensor:
        """See :meth:`Runner.select`."""
        if list(rows) == list(range(tokens.shape[0])):
            return tokens
        return tokens.index_select(0, self._upload(list(rows)))

    def concat(self, parts: Sequence[torch.Tensor]) -> torch.Tensor:
        """See :meth:`Runner.concat`."""
        return parts[0] if len(parts) == 1 else torch.cat(list(parts))

    def to_host(self, tokens: torch.Tensor) -> Pending:
        """See :meth:`Runner.to_host`: side-stream copy into pinned memory plus an event."""
        if not self._cuda:
            return Ready(tokens.numpy())
        assert self._side is not None  # created when self._cuda
        self._side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self._side):
            host = torch.empty(tokens.shape, dtype=tokens.dtype, pin_memory=True)
            host.copy_(tokens, non_blocking=True)
            tokens.record_stream(self._side)
            event = torch.cuda.Event()
            event.record(self._side)
        return _HostCopy(event, host)
