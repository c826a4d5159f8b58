"""One DSA attention step for a mixed batch of decode and prefill rows (issue 19 item 2).

What one engine step does in an MLA layer with DeepSeek sparse attention (DSA) over the paged
``ds_mla_fp8`` cache, the way vLLM's FlashMLA-sparse backend runs it, as a plan / run pair in the
style of FlashInfer's wrappers::

    attn = selkv.dsa.DsaAttention(num_heads=128, topk=2048, num_blocks=nb, page_size=64,
                                  workspace_bytes=256 << 20, max_num_tokens=8192,
                                  sm_scale=scale, device="cuda")
    attn.plan(query_start_loc_cpu, seq_lens_cpu, block_table, slot_mapping,
              num_decodes=nd)                         # host side, once per step (all layers)
    out = attn.run(q, kv_cache, topk_indices, kv_latent, kv_rope)   # per layer: device work only

``run`` does, in order on the current stream:

1. C1 ``write_kv_cache``: the step's new tokens (``kv_latent [T, 512]`` + ``kv_rope [T, 64]``) to
   their ``slot_mapping`` slots (negative slots, i.e. padding, are skipped);
2. C2 ``convert_req_indices_to_slots``: the indexer's request-local top-k positions
   ``[T, K]`` to physical slots through the block table (only the ``T`` planned rows are read:
   seed 004's bounded conversion);
3. decode rows (the first ``num_decodes`` requests, ``S_q`` tokens each): the decode plan
   (``get_decode_metadata``, a device kernel, so it is inside a captured graph) and the sparse
   decode C5 over exactly those rows (or, with ``policy.decode_route = "packed"``, C6: pack the
   selected records into the workspace, then the packed decode);
4. prefill rows, in chunks that fit ``workspace_bytes``: C4 -> C7 (``dequant_sparse_prefill``,
   selected-row dequant of the chunk's physical slots) or C3 -> C7 (``gather_sparse_prefill``:
   each request's context ``[0, seq_len)`` gathered to bf16, indices made relative to it). Which
   route and how the chunks are cut is :class:`DsaPolicy`'s decision, made in :meth:`plan`.

Batch conventions (vLLM's): tokens are ordered by request, **decode requests first**, then the
prefill requests; ``query_start_loc`` ``[R + 1]`` and ``seq_lens`` ``[R]`` (context plus this
step's tokens, i.e. the length after the write) are given on the host; ``block_table``
``[>= R, max_blocks]`` int32 and ``slot_mapping`` ``[>= T]`` int64 on the device. ``q`` is
``[T_pad, H, 576]`` bf16 (latent + RoPE, the up-projection already absorbed), ``topk_indices``
``[>= T, K]`` int32 request-local positions (negative entries and positions past the request's
blocks in ``block_table`` are invalid: skipped, never read; positions in ``[seq_len, allocated)``
must not be selected: the decode and C4 routes read their slots (stale or unwritten records:
in bounds, but no token of the request), while the C3 route gathers only ``[0, seq_len)`` and
skips them; a lightning indexer never selects them), output ``[T_pad, H, 512]`` bf16 and optionally ``lse [T_pad, H]`` fp32.
``T = query_start_loc[-1]`` are the planned tokens; rows ``[T, T_pad)`` of ``q`` are padding:
their output is 0 and lse ``-inf`` and nothing else is done for them. Padding *requests* (e.g. a
decode batch padded to a captured size) are ordinary decode requests whose slot_mapping entries
are negative and whose indices are ``-1``: their rows come out 0 / ``-inf``. A step with no
decode rows, no prefill rows or no rows at all runs only what it has (possibly nothing).

Decode-only steps under CUDA graphs: :meth:`plan` outside the graph (host work, one small
host-to-device copy into a preallocated buffer), then capture :meth:`run` with ``out=`` (and
``lse=``) passed: it launches device work only (write, convert, decode plan, decode), with no host
synchronization and no allocation. Replays recompute the decode plan from the inputs of the
replay. The graph reads the tensors it was captured with (``q``, the cache, ``topk_indices``, the
new KV, ``block_table``, ``slot_mapping``): update them in place between replays. Re-run
:meth:`plan` (same shapes) only if the host metadata changed; for a decode-only step of a fixed
shape it does not (its per-token request ids are ``r // S_q``).

Workspace: ``workspace_bytes`` is one preallocated byte budget shared in stream order by the
prefill routes (bf16 rows plus C4's remapped indices) and the packed decode buffer. Besides it the
wrapper holds per-token buffers sized by ``max_num_tokens``: the converted slots (``K`` int32 per
token), per-token metadata, and lse / max_logits scratch (fp32 ``[max_num_tokens, H]`` each).

CPU tensors run the CPU oracle behind every op, so a whole step runs (slowly) on the CPU.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import torch

from . import formats as _formats
from ._ops import ops as _ops
from .cache_ops import convert_req_indices_to_slots, write_kv_cache
from .decode import DecodeMetadata, get_decode_metadata, sparse_mla_decode, sparse_mla_decode_packed
from .packed import pack_selected_kv, packed_kv_workspace_size
from .prefill import (
    dequant_prefill_workspace_size,
    dequant_sparse_prefill,
    gather_prefill_workspace_size,
    gather_sparse_prefill,
)

__all__ = ["DsaAttention", "DsaPlan", "DsaPolicy", "PrefillChunk"]

ROUTE_DEQUANT = "dequant"  # C4 -> C7 (selected-row dequant of physical slots)
ROUTE_GATHER = "gather"  # C3 -> C7 (gather each request's context, chunk-relative indices)
_FORMAT = "ds_mla_fp8"  # the decode (C5 / C6) reads ds_mla_fp8 only


@dataclasses.dataclass
class DsaPolicy:
    """How a step is routed and chunked: the one place for it. Subclass and override
    :meth:`route` or :meth:`chunk_tokens_cap`, or change the fields.

    Attributes:
        prefill_route: ``"auto"`` (default), ``"dequant"`` or ``"gather"``.
        dequant_ratio: ``"auto"`` sends a prefill request with ``T_r`` query tokens and context
            ``L_r`` (its ``seq_len``) to C4 when ``T_r * K <= dequant_ratio * L_r``, else to C3.
            The rows each route dequantizes are ``T_r * K`` (C4, one per selected entry, duplicates
            included) and ``L_r`` (C3, the whole context once); C7 reads ``T_r * K`` rows either
            way. So: short prefills (a few tokens onto a long context, or chunked-prefill tails)
            take C4, long prefills take C3.
        decode_route: ``"native"`` (C5 over the cache, default) or ``"packed"`` (C6: pack the
            selected records into the workspace first, then the packed decode; same bits).
        dynamic_topk: convert with compaction (valid slots first) and pass the valid counts as
            ``topk_length`` to the decode (when ``S_q == 1``) and to C4 prefill chunks, so rows
            with fewer than ``K`` valid entries (short contexts) skip the rest. Off by default:
            the fixed-top-k decode is the tuned path.
        max_prefill_chunk_tokens: optional cap on the tokens of one prefill chunk.
        decode_max_query_len: when :meth:`DsaAttention.plan` infers ``num_decodes``, the leading
            requests whose query length equals the first one's and is at most this are decode
            requests (vLLM's ``reorder_batch_threshold`` for uniform decodes).

    A request whose context alone does not fit the workspace (C3 needs ``L_r`` rows) always takes
    C4, which chunks by tokens and fits any budget of at least one token's rows.
    """

    prefill_route: str = "auto"
    dequant_ratio: float = 1.0
    decode_route: str = "native"
    dynamic_topk: bool = False
    max_prefill_chunk_tokens: int | None = None
    decode_max_query_len: int = 1

    def __post_init__(self) -> None:
        if self.prefill_route not in ("auto", ROUTE_DEQUANT, ROUTE_GATHER):
            raise ValueError(f"selkv.dsa: prefill_route: expected auto, dequant or gather, got {self.prefill_route!r}")
        if self.decode_route not in ("native", "packed"):
            raise ValueError(f"selkv.dsa: decode_route: expected native or packed, got {self.decode_route!r}")

    def route(self, query_len: int, seq_len: int, topk: int, gather_fits: bool) -> str:
        """The prefill route of one request (``gather_fits``: its context fits the workspace)."""
        if not gather_fits or self.prefill_route == ROUTE_DEQUANT:
            return ROUTE_DEQUANT
        if self.prefill_route == ROUTE_GATHER:
            return ROUTE_GATHER
        return ROUTE_DEQUANT if query_len * topk <= self.dequant_ratio * seq_len else ROUTE_GATHER

    def chunk_tokens_cap(self) -> int | None:
        """An extra bound on the tokens of one prefill chunk (``None``: only the workspace)."""
        return self.max_prefill_chunk_tokens


@dataclasses.dataclass(frozen=True)
class PrefillChunk:
    """One prefill launch: tokens ``[tok_start, tok_end)`` of requests ``[req_start, req_end)``."""

    route: str
    tok_start: int
    tok_end: int
    req_start: int
    req_end: int
    workspace_bytes: int  # bytes of the workspace this chunk uses
    num_kv_rows: int = 0  # C3: rows gathered (sum of the requests' seq_lens)


@dataclasses.dataclass
class DsaPlan:
    """What :meth:`DsaAttention.plan` decided (host data; read it, don't edit it)."""

    num_tokens: int  # planned tokens T (query_start_loc[-1])
    num_reqs: int
    num_decodes: int  # decode requests (the first ones)
    decode_query_len: int  # S_q of each decode request (0 when none)
    chunks: list[PrefillChunk]
    num_convert_rows: int = 0  # rows [0, n) converted to physical slots (decode + C4 rows)

    @property
    def num_decode_tokens(self) -> int:
        return self.num_decodes * self.decode_query_len

    @property
    def num_prefill_tokens(self) -> int:
        return self.num_tokens - self.num_decode_tokens


class DsaAttention:
    """Plans and runs DSA attention steps of one model (all its layers share a plan).

    Args:
        num_heads: query heads ``H`` per rank, 64 or 128 (what C5 and C7 support; pad the heads
            as vLLM does for other counts).
        topk: ``K``, index entries per token, a positive multiple of 64.
        num_blocks, page_size: the geometry of the paged caches passed to :meth:`run`.
        workspace_bytes: the byte budget of the preallocated workspace (prefill chunks, packed
            decode buffer). At least one prefill token's C4 workspace must fit
            (``dequant_prefill_workspace_size(1, K, P)``, about ``K * 1156`` bytes).
        max_num_tokens: most tokens of a step (``q`` rows, padding included).
        max_num_reqs: most requests of a step (default ``max_num_tokens``).
        sm_scale: softmax scale (default ``576 ** -0.5``).
        scale_mode: the C1 writer's scale mode, ``"pow2"`` or ``"amax"``.
        attn_sink: optional fp32 ``[H]`` sink logits (decode and prefill).
        policy: a :class:`DsaPolicy` (default ``DsaPolicy()``).
        device: where the buffers live (a CPU device runs the CPU oracle).
    """

    def __init__(
        self,
        num_heads: int,
        topk: int,
        *,
        num_blocks: int,
        page_size: int,
        workspace_bytes: int,
        max_num_tokens: int,
        max_num_reqs: int | None = None,
        sm_scale: float | None = None,
        scale_mode: str = "pow2",
        attn_sink: torch.Tensor | None = None,
        policy: DsaPolicy | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        self.device = torch.device(device if device is not None else "cuda")
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        if num_heads not in (64, 128):
            raise ValueError(f"selkv.dsa: num_heads: expected 64 or 128, got {num_heads}")
        if topk <= 0 or topk % 64:
            raise ValueError(f"selkv.dsa: topk: expected a positive multiple of 64, got {topk}")
        if int(num_blocks) < 1 or int(page_size) < 1:
            raise ValueError(f"selkv.dsa: num_blocks and page_size: expected >= 1, got {num_blocks} and {page_size}")
        if int(max_num_tokens) < 0 or (max_num_reqs is not None and int(max_num_reqs) < 0):
            raise ValueError(f"selkv.dsa: max_num_tokens / max_num_reqs: expected >= 0, got {max_num_tokens} / "
                             f"{max_num_reqs}")
        self.num_heads, self.topk = int(num_heads), int(topk)
        self.num_blocks, self.page_size = int(num_blocks), int(page_size)
        self.num_slots = self.num_blocks * self.page_size
        self.workspace_bytes = int(workspace_bytes)
        self.max_num_tokens = int(max_num_tokens)
        self.max_num_reqs = int(max_num_reqs if max_num_reqs is not None else max_num_tokens)
        self.sm_scale = float(sm_scale if sm_scale is not None else _formats.QK_DIM**-0.5)
        self.scale_mode = scale_mode
        self.attn_sink = attn_sink
        self.policy = policy if policy is not None else DsaPolicy()

        self.max_dequant_tokens = self._max_dequant_tokens()
        if self.max_dequant_tokens < 1:
            need = dequant_prefill_workspace_size(1, self.topk, self.num_slots, _FORMAT)
            raise ValueError(
                f"selkv.dsa: workspace_bytes: {self.workspace_bytes} bytes do not hold one prefill "
                f"token's C4 workspace ({need} bytes for K = {self.topk})"
            )
        T, R, H, K, dev = self.max_num_tokens, self.max_num_reqs, self.num_heads, self.topk, self.device
        self._workspace = torch.empty((max(self.workspace_bytes, 16),), dtype=torch.uint8, device=dev)
        self._slots = torch.empty((T, K), dtype=torch.int32, device=dev)
        self._counts = torch.empty((T,), dtype=torch.int32, device=dev)
        self._lse = torch.empty((T, H), dtype=torch.float32, device=dev)
        self._max_logits = torch.empty((T, H), dtype=torch.float32, device=dev)
        # Host-planned int32 metadata, one copy per plan: [req_id | tok_len | tok_ws] per token,
        # then [seq_starts (0) | seq_lens | ws_starts] per request.
        self._meta = torch.zeros((3 * T + 3 * R,), dtype=torch.int32, device=dev)
        self._decode_md: DecodeMetadata | None = None
        self._plan: DsaPlan | None = None
        self._block_table: torch.Tensor | None = None
        self._slot_mapping: torch.Tensor | None = None

    # ---- sizes --------------------------------------------------------------------------------
    def _max_dequant_tokens(self) -> int:
        """Most tokens whose C4 workspace fits the budget (the size grows with the tokens)."""
        fits = lambda t: dequant_prefill_workspace_size(t, self.topk, self.num_slots, _FORMAT) <= self.workspace_bytes  # noqa: E731
        if not fits(1):
            return 0
        lo, hi = 1, max(1, self.max_num_tokens)
        if fits(hi):
            return hi
        while hi - lo > 1:  # fits(lo), not fits(hi)
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid)
        return lo

    def _meta_views(self) -> tuple[torch.Tensor, ...]:
        T, R = self.max_num_tokens, self.max_num_reqs
        m = self._meta
        return m[:T], m[T : 2 * T], m[2 * T : 3 * T], m[3 * T : 3 * T + R], m[3 * T + R : 3 * T + 2 * R], m[3 * T + 2 * R :]

    @property
    def last_plan(self) -> DsaPlan | None:
        return self._plan

    # ---- plan (host) --------------------------------------------------------------------------
    def plan(
        self,
        query_start_loc: Sequence[int] | torch.Tensor,
        seq_lens: Sequence[int] | torch.Tensor,
        block_table: torch.Tensor,
        slot_mapping: torch.Tensor | None = None,
        *,
        num_decodes: int | None = None,
    ) -> DsaPlan:
        """Plans a step from host metadata; launches only one host-to-device copy.

        Args:
            query_start_loc: host ints ``[R + 1]`` (a list or a CPU tensor), token offsets of the
                requests, starting at 0; decode requests first.
            seq_lens: host ints ``[R]``, each request's length after this step's tokens (context +
                query tokens), ``>=`` its query length.
            block_table: device int32 ``[>= R, max_blocks]`` (kept; :meth:`run` reads it).
            slot_mapping: device int64 ``[>= T]`` slots of the new tokens (kept; needed when
                :meth:`run` is given the new KV).
            num_decodes: decode requests at the front, each with the same query length ``S_q``;
                default: inferred with ``policy.decode_max_query_len``.

        Returns:
            the :class:`DsaPlan` (also :attr:`last_plan`).
        """
        qsl = [int(x) for x in (query_start_loc.tolist() if isinstance(query_start_loc, torch.Tensor) else query_start_loc)]
        lens = [int(x) for x in (seq_lens.tolist() if isinstance(seq_lens, torch.Tensor) else seq_lens)]
        R = len(qsl) - 1
        if R < 0 or len(lens) != R or (R >= 0 and qsl[0] != 0):
            raise ValueError("selkv.dsa.plan: query_start_loc must be [R + 1] starting at 0 and seq_lens [R]")
        qlen = [qsl[r + 1] - qsl[r] for r in range(R)]
        T = qsl[-1]
        if any(q < 0 for q in qlen):
            raise ValueError("selkv.dsa.plan: query_start_loc must be non-decreasing")
        if T > self.max_num_tokens or R > self.max_num_reqs:
            raise ValueError(
                f"selkv.dsa.plan: {T} tokens / {R} requests exceed max_num_tokens {self.max_num_tokens} / "
                f"max_num_reqs {self.max_num_reqs}"
            )
        if not isinstance(block_table, torch.Tensor) or block_table.dim() != 2:
            raise ValueError("selkv.dsa.plan: block_table: expected a 2-d tensor [>= R, max_blocks]")
        if R and block_table.size(0) < R:
            raise ValueError(f"selkv.dsa.plan: block_table has {block_table.size(0)} rows for {R} requests")
        if num_decodes is None:
            num_decodes = 0
            if R and 0 < qlen[0] <= self.policy.decode_max_query_len:
                while num_decodes < R and qlen[num_decodes] == qlen[0]:
                    num_decodes += 1
        if not 0 <= num_decodes <= R:
            raise ValueError(f"selkv.dsa.plan: num_decodes {num_decodes} not in [0, {R}]")
        s_q = qlen[0] if num_decodes else 0
        if num_decodes and (s_q <= 0 or any(q != s_q for q in qlen[:num_decodes])):
            raise ValueError("selkv.dsa.plan: decode requests must all have the same positive query length")
        for r in range(num_decodes, R):
            if lens[r] < qlen[r]:
                raise ValueError(f"selkv.dsa.plan: request {r}: seq_len {lens[r]} < query length {qlen[r]}")

        # Per-request routes, then chunks of consecutive requests of one route.
        chunks: list[PrefillChunk] = []
        gather_rows_max = self._max_gather_rows()
        cap = self.policy.chunk_tokens_cap()
        tok_cap = self.max_dequant_tokens if cap is None else max(1, min(cap, self.max_dequant_tokens))
        r = num_decodes
        while r < R:
            if qlen[r] == 0:
                r += 1
                continue
            route = self.policy.route(qlen[r], lens[r], self.topk, lens[r] <= gather_rows_max)
            if route == ROUTE_GATHER:
                r0, rows = r, 0
                while (
                    r < R
                    and (qlen[r] == 0 or self.policy.route(qlen[r], lens[r], self.topk, lens[r] <= gather_rows_max) == ROUTE_GATHER)
                    and rows + lens[r] <= gather_rows_max
                    and (cap is None or qsl[r + 1] - qsl[r0] <= cap or r == r0)
                ):
                    rows += lens[r] if qlen[r] else 0
                    r += 1
                chunks.append(PrefillChunk(ROUTE_GATHER, qsl[r0], qsl[r], r0, r,
                                           gather_prefill_workspace_size(rows, _FORMAT), rows))
            else:
                # C4 chunks are token ranges (indices are physical slots, any request mix).
                r0 = r
                while r < R and (qlen[r] == 0 or self.policy.route(qlen[r], lens[r], self.topk, lens[r] <= gather_rows_max) == ROUTE_DEQUANT):
                    r += 1
                t, t_end = qsl[r0], qsl[r]
                while t < t_end:
                    n = min(tok_cap, t_end - t)
                    chunks.append(PrefillChunk(ROUTE_DEQUANT, t, t + n, r0, r,
                                               dequant_prefill_workspace_size(n, self.topk, self.num_slots, _FORMAT)))
                    t += n

        if self.policy.decode_route == "packed" and num_decodes:
            need = packed_kv_workspace_size(num_decodes, s_q, self.topk)
            if need > self.workspace_bytes:
                raise ValueError(f"selkv.dsa.plan: the packed decode needs {need} workspace bytes, the budget is {self.workspace_bytes}")

        # Per-token and per-request metadata, one copy.
        tT, tR = self.max_num_tokens, self.max_num_reqs
        host = torch.zeros((3 * tT + 3 * tR,), dtype=torch.int32)
        if T:
            qlen_t = torch.tensor(qlen, dtype=torch.int64)
            lens_t = torch.tensor(lens, dtype=torch.int32)
            host[:T] = torch.repeat_interleave(torch.arange(R, dtype=torch.int32), qlen_t)
            host[tT : tT + T] = torch.repeat_interleave(lens_t, qlen_t)
            ws = [0] * R
            for c in chunks:
                if c.route == ROUTE_GATHER:
                    off = 0
                    for rr in range(c.req_start, c.req_end):
                        ws[rr] = off
                        off += lens[rr] if qlen[rr] else 0
            ws_t = torch.tensor(ws, dtype=torch.int32)
            host[2 * tT : 2 * tT + T] = torch.repeat_interleave(ws_t, qlen_t)
            host[3 * tT + tR : 3 * tT + tR + R] = lens_t * (qlen_t > 0).to(torch.int32)
            host[3 * tT + 2 * tR : 3 * tT + 2 * tR + R] = ws_t
        if self.device.type == "cuda":
            host = host.pin_memory()
        self._meta.copy_(host, non_blocking=True)  # the caching host allocator keeps `host` alive

        if num_decodes:
            self._decode_md = get_decode_metadata(
                num_decodes, s_q, self.num_heads, self.topk,
                self._counts[:num_decodes] if self._decode_dynamic(s_q) else None,
                device=self.device, out=self._decode_md,
            )
        self._block_table, self._slot_mapping = block_table, slot_mapping
        n_conv = max([num_decodes * s_q] + [c.tok_end for c in chunks if c.route == ROUTE_DEQUANT])
        self._plan = DsaPlan(T, R, num_decodes, s_q, chunks, n_conv)
        return self._plan

    def _max_gather_rows(self) -> int:
        """Most rows C3 may gather into the budget (its size is the rows' bytes rounded up to 256)."""
        return (self.workspace_bytes // 256 * 256) // (_formats.QK_DIM * 2)

    def _decode_dynamic(self, s_q: int) -> bool:
        return self.policy.dynamic_topk and s_q == 1

    # ---- run (device) -------------------------------------------------------------------------
    def run(
        self,
        q: torch.Tensor,
        kv_cache: torch.Tensor,
        topk_indices: torch.Tensor,
        kv_latent: torch.Tensor | None = None,
        kv_rope: torch.Tensor | None = None,
        *,
        out: torch.Tensor | None = None,
        lse: torch.Tensor | None = None,
        return_lse: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Runs the planned step for one layer: device work only, no host synchronization.

        Args:
            q: bf16 ``[T_pad, H, 576]``, ``T_pad >= T`` (rows past ``T`` are padding).
            kv_cache: uint8 ``[num_blocks, page_size, 656]`` this layer's cache (written in place).
            topk_indices: int32 ``[>= T, K]`` request-local positions from the indexer.
            kv_latent, kv_rope: bf16 ``[>= T, 512]`` and ``[>= T, 64]``, the new tokens' KV; when
                given they are written to the planned ``slot_mapping`` first (C1). Pass ``None``
                when the cache was already written.
            out: optional bf16 ``[T_pad, H, 512]`` (pass it, and ``lse``, under CUDA graphs).
            lse: optional fp32 ``[T_pad, H]``; implies ``return_lse``.
            return_lse: also return the natural-log logsumexp per row and head (``-inf`` for a
                row without a valid entry).

        Returns:
            ``out``, or ``(out, lse)`` with ``return_lse`` / ``lse``.
        """
        p = self._plan
        if p is None:
            raise RuntimeError("selkv.dsa.run: call plan() first")
        H, K = self.num_heads, self.topk
        if q.dim() != 3 or q.shape[1] != H or q.shape[2] != _formats.QK_DIM:
            raise ValueError(f"selkv.dsa.run: q: expected [T_pad, {H}, 576], got {tuple(q.shape)}")
        T_pad, T = q.shape[0], p.num_tokens
        if T_pad < T or T_pad > self.max_num_tokens:
            raise ValueError(f"selkv.dsa.run: q has {T_pad} rows, the plan {T} (at most max_num_tokens {self.max_num_tokens})")
        if tuple(kv_cache.shape[:2]) != (self.num_blocks, self.page_size):
            raise ValueError(f"selkv.dsa.run: kv_cache: expected [{self.num_blocks}, {self.page_size}, 656], got {tuple(kv_cache.shape)}")
        if topk_indices.dim() != 2 or topk_indices.shape[1] != K or topk_indices.shape[0] < T:
            raise ValueError(f"selkv.dsa.run: topk_indices: expected [>= {T}, {K}], got {tuple(topk_indices.shape)}")
        if out is None:
            out = torch.empty((T_pad, H, _formats.V_DIM), dtype=torch.bfloat16, device=q.device)
        want_lse = return_lse or lse is not None
        if lse is None:
            lse = self._lse[:T_pad] if not return_lse else torch.empty((T_pad, H), dtype=torch.float32, device=q.device)
        req_id, tok_len, tok_ws, seq_starts, seq_lens, ws_starts = self._meta_views()

        if kv_latent is not None and T:
            if self._slot_mapping is None:
                raise RuntimeError("selkv.dsa.run: the new KV was given but plan() had no slot_mapping")
            write_kv_cache(kv_latent[:T], None if kv_rope is None else kv_rope[:T], self._slot_mapping[:T],
                           kv_cache, _FORMAT, self.scale_mode)

        n_dec = p.num_decode_tokens
        dyn = self.policy.dynamic_topk
        n_conv = p.num_convert_rows
        if n_conv:
            # One conversion over the rows that read physical slots: [0, the last such row).
            convert_req_indices_to_slots(
                topk_indices[:n_conv], req_id, self._block_table, self.page_size, self.num_blocks,
                compact=dyn, return_valid_counts=dyn, out=self._slots[:n_conv],
                valid_counts=self._counts[:n_conv] if dyn else None,
            )

        if n_dec:
            self._run_decode(q, kv_cache, out, lse, p)

        for c in p.chunks:
            s = slice(c.tok_start, c.tok_end)
            if c.route == ROUTE_DEQUANT:
                dequant_sparse_prefill(
                    q[s], kv_cache, self._slots[s], self.sm_scale, _FORMAT,
                    topk_length=self._counts[s] if dyn else None,
                    workspace=self._workspace[: max(c.workspace_bytes, 16)],
                    out=out[s], max_logits=self._max_logits[s], lse=lse[s], attn_sink=self.attn_sink,
                )
            else:
                # Indices relative to the gathered rows: ws_start + pos, valid iff 0 <= pos < seq_len.
                pos = topk_indices[s]
                idx = self._slots[s]
                bad = (pos < 0) | (pos >= tok_len[s, None])
                torch.add(pos, tok_ws[s, None], out=idx).masked_fill_(bad, -1)
                r = slice(c.req_start, c.req_end)
                gather_sparse_prefill(
                    q[s], kv_cache, self._block_table[r], seq_starts[r], seq_lens[r], ws_starts[r], idx,
                    c.num_kv_rows, self.sm_scale, _FORMAT,
                    workspace=self._workspace[: max(c.workspace_bytes, 16)],
                    out=out[s], max_logits=self._max_logits[s], lse=lse[s], attn_sink=self.attn_sink,
                )

        if T_pad > T:  # padding rows: 0 / -inf, like a row without a valid entry
            out[T:].zero_()
            lse[T:].fill_(float("-inf"))
        return (out, lse) if want_lse else out

    def _run_decode(self, q, kv_cache, out, lse, p: DsaPlan) -> None:
        B, S = p.num_decodes, p.decode_query_len
        n = B * S
        tl = self._counts[:B] if self._decode_dynamic(S) else None
        # The plan is a device kernel: inside a captured graph it is re-made on every replay.
        md = get_decode_metadata(B, S, self.num_heads, self.topk, tl, out=self._decode_md)
        q3, o3, l3 = q[:n].unflatten(0, (B, S)), out[:n].unflatten(0, (B, S)), lse[:n].unflatten(0, (B, S))
        idx3 = self._slots[:n].unflatten(0, (B, S))
        if self.policy.decode_route == "packed":
            packed = self._workspace[: max(packed_kv_workspace_size(B, S, self.topk), 16)]
            pack_selected_kv(kv_cache, idx3, tl, out=packed)
            sparse_mla_decode_packed(q3, packed, md, self.sm_scale, topk=self.topk, topk_length=tl,
                                     attn_sink=self.attn_sink, out=o3, lse=l3, workspace=md.workspace)
        else:
            sparse_mla_decode(q3, kv_cache, idx3, md, self.sm_scale, topk_length=tl,
                              attn_sink=self.attn_sink, out=o3, lse=l3, workspace=md.workspace)
