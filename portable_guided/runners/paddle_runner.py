"""SmolLM2 with Paddle ops: the same Llama forward and slot-based KV cache as
:mod:`.torch_runner`, on the same de-quantized weights (copied once through NumPy), plus the
device ops of the :class:`portable_guided.decode.device.Runner` protocol on Paddle tensors.

``tests/runners/test_paddle_runner.py`` checks its logits against the PyTorch runner's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import paddle
import paddle.nn.functional as F

from portable_guided.decode.device import (
    Pending,
    Ready,
    SamplingParams,
    SlotLengths,
    tree_layout,
)
from portable_guided.runners.weights import LlamaSpec, load_tokenizer, numpy_weights

__all__ = ["PaddleLlama", "PaddleRunner"]


def _rms_norm(x: paddle.Tensor, weight: paddle.Tensor, eps: float) -> paddle.Tensor:
    var = x.pow(2).mean(-1, keepdim=True)
    return x * paddle.rsqrt(var + eps) * weight


def _rotate_half(x: paddle.Tensor) -> paddle.Tensor:
    half = x.shape[-1] // 2
    return paddle.concat([-x[..., half:], x[..., :half]], axis=-1)


class PaddleLlama:
    """A Llama decoder over a KV cache laid out ``[slot * max_len + position, kv_head, dim]``."""

    def __init__(self, spec: LlamaSpec, weights: dict[str, np.ndarray]) -> None:
        self.spec = spec

        def t(a: np.ndarray) -> paddle.Tensor:
            return paddle.to_tensor(np.ascontiguousarray(a, dtype=np.float32))

        self.embed = t(weights["model.embed_tokens.weight"])
        self.lm_head_t = t(
            (weights["model.embed_tokens.weight"] if spec.tie_embeddings
             else weights["lm_head.weight"]).T
        )
        self.final_norm = t(weights["model.norm.weight"])
        self.layers = []
        for i in range(spec.num_layers):
            p = f"model.layers.{i}."
            qkv = np.concatenate(
                [weights[p + f"self_attn.{n}_proj.weight"] for n in ("q", "k", "v")], axis=0
            )
            gate_up = np.concatenate(
                [weights[p + "mlp.gate_proj.weight"], weights[p + "mlp.up_proj.weight"]], axis=0
            )
            self.layers.append(
                (
                    t(weights[p + "input_layernorm.weight"]),
                    t(qkv.T),
                    t(weights[p + "self_attn.o_proj.weight"].T),
                    t(weights[p + "post_attention_layernorm.weight"]),
                    t(gate_up.T),
                    t(weights[p + "mlp.down_proj.weight"].T),
                )
            )
        d = spec.head_dim
        self.inv_freq = paddle.to_tensor(
            1.0 / (spec.rope_theta ** (np.arange(0, d, 2, dtype=np.float32) / d))
        )
        self.k_cache: list[paddle.Tensor] = []
        self.v_cache: list[paddle.Tensor] = []
        self.max_len = 0

    def allocate(self, max_slots: int, max_len: int) -> None:
        """Allocate (zeroed) caches for ``max_slots`` x ``max_len`` tokens."""
        s = self.spec
        shape = [max_slots * max_len, s.num_kv_heads, s.head_dim]
        self.k_cache = [paddle.zeros(shape, dtype="float32") for _ in range(s.num_layers)]
        self.v_cache = [paddle.zeros(shape, dtype="float32") for _ in range(s.num_layers)]
        self.max_len = max_len

    @paddle.no_grad()
    def forward(
        self,
        input_ids: paddle.Tensor,
        slots: paddle.Tensor,
        starts: paddle.Tensor,
        key_len: int,
        out_rows: paddle.Tensor | None,
        tree: tuple[paddle.Tensor, paddle.Tensor] | None = None,
    ) -> paddle.Tensor:
        """Same contract as :meth:`TorchLlama.forward` (``tree``'s ancestors as int32)."""
        s = self.spec
        b, t = input_ids.shape
        kv, g, d = s.num_kv_heads, s.num_heads // s.num_kv_heads, s.head_dim
        steps = paddle.arange(t, dtype="int64")
        stored = starts.unsqueeze(1) + steps.unsqueeze(0)  # [B, T] cache positions
        write_idx = (slots.unsqueeze(1) * self.max_len + stored).reshape([-1])
        keys_pos = paddle.arange(key_len, dtype="int64")
        read_idx = (slots.unsqueeze(1) * self.max_len + keys_pos.unsqueeze(0)).reshape([-1])
        if tree is None:
            pos = stored
            allowed = keys_pos.reshape([1, 1, -1]) <= pos.unsqueeze(2)  # [B, T, L]
        else:
            depth, ancestors = tree
            pos = starts.unsqueeze(1) + depth
            rel = keys_pos.unsqueeze(0) - starts.unsqueeze(1)  # [B, L]: key's index in the tree
            in_tree = paddle.logical_and(rel >= 0, rel < t)
            idx = paddle.clip(rel, 0, t - 1).unsqueeze(1).expand([b, t, key_len])
            seen = paddle.take_along_axis(ancestors, idx, axis=2) > 0
            allowed = paddle.logical_or(
                (rel < 0).unsqueeze(1), paddle.logical_and(seen, in_tree.unsqueeze(1))
            )
        bias = paddle.where(
            allowed, paddle.zeros([], "float32"), paddle.full([], float("-inf"), "float32")
        ).reshape([b, 1, 1, t, key_len])
        freqs = pos.astype("float32").unsqueeze(-1) * self.inv_freq  # [B, T, D/2]
        emb = paddle.concat([freqs, freqs], axis=-1)
        cos, sin = emb.cos().unsqueeze(2), emb.sin().unsqueeze(2)  # [B, T, 1, D]
        scale = d**-0.5

        # Linear layers see [B*T, H]: Paddle's CPU matmul is much faster on 2-D inputs.
        x = F.embedding(input_ids.reshape([-1]), self.embed)  # [B*T, H]
        for layer, (ln1, w_qkv, w_o, ln2, w_gu, w_down) in enumerate(self.layers):
            h = _rms_norm(x, ln1, s.rms_eps)
            qkv = paddle.matmul(h, w_qkv)
            q, k, v = paddle.split(qkv, [s.num_heads * d, kv * d, kv * d], axis=-1)
            q = q.reshape([b, t, s.num_heads, d])
            k = k.reshape([b, t, kv, d])
            v = v.reshape([b, t, kv, d])
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            kc, vc = self.k_cache[layer], self.v_cache[layer]
            kc.scatter_(write_idx, k.reshape([-1, kv, d]), overwrite=True)
            vc.scatter_(write_idx, v.reshape([-1, kv, d]), overwrite=True)
            keys = paddle.index_select(kc, read_idx, axis=0).reshape([b, key_len, kv, d])
            vals = paddle.index_select(vc, read_idx, axis=0).reshape([b, key_len, kv, d])
            keys = keys.transpose([0, 2, 1, 3]).unsqueeze(2)  # [B, KV, 1, L, D]
            vals = vals.transpose([0, 2, 1, 3]).unsqueeze(2)
            qh = q.reshape([b, t, kv, g, d]).transpose([0, 2, 3, 1, 4])  # [B, KV, G, T, D]
            scores = paddle.matmul(qh, keys, transpose_y=True) * scale + bias
            attn = paddle.matmul(F.softmax(scores, axis=-1), vals)  # [B, KV, G, T, D]
            attn = attn.transpose([0, 3, 1, 2, 4]).reshape([b * t, s.num_heads * d])
            x = x + paddle.matmul(attn, w_o)
            h = _rms_norm(x, ln2, s.rms_eps)
            gate, up = paddle.chunk(paddle.matmul(h, w_gu), 2, axis=-1)
            x = x + paddle.matmul(F.silu(gate) * up, w_down)
        if out_rows is not None:
            x = paddle.index_select(x, out_rows, axis=0)
        return paddle.matmul(_rms_norm(x, self.final_norm, s.rms_eps), self.lm_head_t)


class _HostCopy:
    """A device-to-host token copy on a side stream, completed by an event."""

    __slots__ = ("_event", "_host")

    def __init__(self, event: Any, host: paddle.Tensor) -> None:
        self._event, self._host = event, host

    def wait(self) -> np.ndarray:
        self._event.synchronize()
        return self._host.numpy()


class PaddleRunner(SlotLengths):
    """The Paddle runner: :class:`PaddleLlama` plus the decode loop's device operations.

    Example::

        runner = PaddleRunner.from_pretrained()
    """

    framework = "paddle"

    def __init__(self, model: PaddleLlama, tokenizer: Any = None) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.vocab_size = model.spec.vocab_size
        self.eos_token_id = model.spec.eos_token_id
        self._lengths: dict[int, int] = {}
        self._gpu = "gpu" in str(paddle.get_device())
        #: Overlap grammar work with the forward only when the forward is not on these cores.
        self.prefers_overlap = not str(paddle.get_device()).startswith("cpu")
        self._side = paddle.device.Stream() if self._gpu else None
        self._upload_events: dict[int, Any] = {}
        self._seed: int | None = None

    @classmethod
    def from_pretrained(cls, device: str | None = None) -> PaddleRunner:
        """Load SmolLM2 (de-quantized once per process) onto ``device`` (default: Paddle's)."""
        if device is not None:
            paddle.set_device(device)
        spec, weights = numpy_weights()
        return cls(PaddleLlama(spec, weights), load_tokenizer())

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
    ) -> paddle.Tensor:
        """See :meth:`Runner.forward`."""
        if isinstance(tokens, paddle.Tensor):
            ids = tokens.astype("int64").reshape([-1, 1])
        else:
            host = np.asarray(tokens, dtype=np.int64)
            if host.ndim != 2:
                raise ValueError(f"host tokens must be 2-D [batch, steps], got shape {host.shape}")
            ids = paddle.to_tensor(host)
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
            tree = (paddle.to_tensor(depth), paddle.to_tensor(ancestors.astype(np.int32)))
        if all_positions or tree is not None:
            rows = [i * t + j for i, c in enumerate(counts) for j in range(c)]
        else:
            rows = [i * t + c - 1 for i, c in enumerate(counts)]
        logits = self.model.forward(
            ids,
            paddle.to_tensor(list(slots), dtype="int64"),
            paddle.to_tensor(starts, dtype="int64"),
            key_len,
            None if rows == list(range(b * t)) else paddle.to_tensor(rows, dtype="int64"),
            tree,
        )
        for s, st, c in zip(slots, starts, counts):
            self._lengths[s] = st + c
        return logits

    def _move_cache_rows(self, slot: int, src: list[int], dst: list[int]) -> None:
        base = slot * self.model.max_len
        src_t = paddle.to_tensor([base + p for p in src], dtype="int64")
        dst_t = paddle.to_tensor([base + p for p in dst], dtype="int64")
        for cache in (*self.model.k_cache, *self.model.v_cache):
            cache.scatter_(dst_t, paddle.index_select(cache, src_t, axis=0), overwrite=True)

    # -- device ops -----------------------------------------------------------------------
    def host_buffer(self, shape: tuple[int, ...]) -> np.ndarray:
        """See :meth:`Runner.host_buffer`."""
        return np.empty(shape, dtype=np.int32)

    def upload_bitmask(self, host_bitmask: np.ndarray) -> paddle.Tensor:
        """See :meth:`Runner.upload_bitmask`: on GPU a side-stream copy the compute stream
        waits on; on CPU a zero-copy view of the host buffer."""
        if not self._gpu:
            return paddle.from_dlpack(host_bitmask.__dlpack__())
        compute = paddle.device.current_stream()
        with paddle.device.stream_guard(self._side):
            pinned = paddle.to_tensor(host_bitmask, place=paddle.CUDAPinnedPlace())
            dev = pinned._copy_to(paddle.get_device(), False)
            event = paddle.device.Event()
            event.record(self._side)
        compute.wait_event(event)
        self._upload_events[host_bitmask.ctypes.data] = event
        return dev

    def host_bitmask_ready(self, host_bitmask: np.ndarray) -> None:
        """See :meth:`Runner.host_bitmask_ready`."""
        event = self._upload_events.pop(host_bitmask.ctypes.data, None)
        if event is not None:
            event.synchronize()

    def apply_mask(self, logits: paddle.Tensor, bitmask: paddle.Tensor) -> paddle.Tensor:
        """See :meth:`Runner.apply_mask` (``portable_guided.apply_token_mask`` on Paddle)."""
        from portable_guided import apply_token_mask

        return apply_token_mask(logits, bitmask, vocab_size=self.vocab_size)

    def sample(self, logits: paddle.Tensor, params: SamplingParams) -> paddle.Tensor:
        """See :meth:`Runner.sample`."""
        if params.greedy:
            return paddle.argmax(logits, axis=-1)
        if self._seed != params.seed:
            paddle.seed(params.seed)
            self._seed = params.seed
        probs = F.softmax(logits.astype("float32") / params.temperature, axis=-1)
        if params.top_p < 1.0:
            sorted_p = paddle.sort(probs, axis=-1, descending=True)
            order = paddle.argsort(probs, axis=-1, descending=True)
            drop = (paddle.cumsum(sorted_p, axis=-1) - sorted_p) >= params.top_p
            sorted_p = paddle.where(drop, paddle.zeros_like(sorted_p), sorted_p)
            probs = paddle.put_along_axis(paddle.zeros_like(probs), order, sorted_p, axis=-1)
        return paddle.multinomial(probs, 1).reshape([-1])

    def select(self, tokens: paddle.Tensor, rows: Sequence[int]) -> paddle.Tensor:
        """See :meth:`Runner.select`."""
        if list(rows) == list(range(tokens.shape[0])):
            return tokens
        return paddle.index_select(tokens, paddle.to_tensor(list(rows), dtype="int64"), axis=0)

    def concat(self, parts: Sequence[paddle.Tensor]) -> paddle.Tensor:
        """See :meth:`Runner.concat`."""
        return parts[0] if len(parts) == 1 else paddle.concat(list(parts))

    def to_host(self, tokens: paddle.Tensor) -> Pending:
        """See :meth:`Runner.to_host`: on GPU a side-stream copy to pinned memory + event."""
        if not self._gpu:
            return Ready(tokens.numpy())
        assert self._side is not None  # created when self._gpu
        self._side.wait_stream(paddle.device.current_stream())
        with paddle.device.stream_guard(self._side):
            host = tokens._copy_to(paddle.CUDAPinnedPlace(), False)
            event = paddle.device.Event()
            event.record(self._side)
        return _HostCopy(event, host)
