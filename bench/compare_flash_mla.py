#!/usr/bin/env python3
"""Side by side with FlashMLA (DESIGN §6): the same inputs through selkv and FlashMLA's Python API.

    PYTHONPATH=python:<dir holding flash_mla> SELKV_OPS_LIBRARY=build/python/selkv/_selkv_ops.so \
        python3 bench/compare_flash_mla.py [--quick] [--ops decode,prefill,packed,model1] [--csv out.csv]

For every case of the C5 decode and C7 prefill targets (issues 3 and 4), and of seed 000's packed
decode grid (``--ops packed``: selkv native, packed, pack + packed, the pack against a device copy
of its bytes, and FlashMLA's native decode, all timed interleaved, with geometric means), it builds one set of
inputs on the GPU, runs both libraries on exactly those tensors (selkv's uint8 ``ds_mla_fp8``
cache is FlashMLA's FP8 cache viewed as ``float8_e4m3fn [blocks, page, 1, 656]``; the bf16 kv of
the prefill is ``[N, D]`` for selkv and the same memory as ``[N, 1, D]`` for FlashMLA), checks
that the two outputs agree, and times both the same way: a 512 MiB buffer is zeroed before every
timed call (L2 flush, as the C++ harness does), CUDA events around the call, median of the reps;
schedule metadata is made outside the timed region (FlashMLA's on its first, untimed call).
``--timing kineto`` times both as FlashMLA's own benchmark does (kernelkit ``bench_kineto``: an
8 GB memset before every rep, the call's kernel span from CUPTI, mean of the reps).
The memset leaves the SMs' instruction caches holding whatever ran before; ``--flush icache``
adds the C++ harness's instruction-cache sweep (``bench/icache_sweep.cu``, compiled with nvcc on
first use) so that every call starts with cold caches whatever ``--order`` puts before it.
``--graph`` times a CUDA-graph replay of the call instead of the eager call (both libraries are
graph capturable); small decode shapes are dominated by launch latency either way, so say which.

``--ops model1``: FlashMLA's MODEL1 sparse decode (d_qk 512, 584-byte ``model1_fp8`` tokens in
pages padded to 576 bytes, optional extra KV cache), the cases of issue 18: FlashMLA's test file's
production configs CONFIG1-4 for B in {2, 64, 74, 128, 148, 256} and its d_qk 512 peak cases.
Both caches are written by selkv's C1 writer on the device; FlashMLA gets them as its
``[num_blocks, page, 1, 584]`` float8 view of the padded pages. Three calls are timed interleaved
on the same tensors: selkv's ops (``get_decode_metadata`` + ``sparse_mla_decode``, as the decode
rows), selkv's drop-in ``selkv.flash_mla.flash_mla_with_kvcache`` with FlashMLA's exact arguments
(what an engine switching imports costs: argument checks and the lse fix-up kernel included), and
FlashMLA's ``flash_mla_with_kvcache``.

Nothing of FlashMLA is part of this project: the script only imports ``flash_mla`` when it is
importable (built ad hoc by whoever runs it) and reports selkv alone otherwise.

CSV columns: op, shape, variant, selkv_us, flash_mla_us, flash_mla/selkv (> 1: selkv faster),
selkv_TFLOPS, flash_mla_TFLOPS, pct_of_matmul (selkv), out_cos_diff, out_max_abs_diff, timing,
git_hash, gpu. The bf16 matmul ceiling of the same run is a row too.
"""

from __future__ import annotations

import argparse
import csv
import ctypes
import dataclasses
import importlib
import math
import os
import pathlib
import re
import shutil
import statistics
import subprocess
import sys
from typing import Callable

import torch

import selkv
from bench_common import git_hash

FLUSH_BYTES = 512 << 20
D_QK, D_V, RECORD_BYTES, PAGE = 576, 512, 656, 64


def icache_sweep() -> Callable[[torch.Tensor], None]:
    """The C++ harness's instruction-cache flush (bench/icache_sweep.cu) as a callable on the
    current stream: the file compiled alone with nvcc into a shared library (cached by the
    source's mtime) and called through ctypes."""
    src = pathlib.Path(__file__).resolve().parent / "icache_sweep.cu"
    cache = pathlib.Path(os.environ.get("XDG_CACHE_HOME", pathlib.Path.home() / ".cache")) / "selkv"
    lib = cache / f"libselkv_icache_sweep_{int(src.stat().st_mtime)}.so"
    if not lib.exists():
        nvcc = shutil.which("nvcc") or os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc")
        major, minor = torch.cuda.get_device_capability()
        arch = f"{major}{minor}" + ("a" if major == 9 else "")
        cache.mkdir(parents=True, exist_ok=True)
        tmp = lib.with_suffix(f".{os.getpid()}.tmp")
        subprocess.run([nvcc, "-O3", "-shared", "-Xcompiler", "-fPIC", f"-gencode=arch=compute_{arch},code=sm_{arch}",
                        str(src), "-o", str(tmp)], check=True)
        tmp.replace(lib)
    fn = ctypes.CDLL(str(lib)).selkv_bench_icache_sweep
    fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_void_p], ctypes.c_int

    def sweep(sink: torch.Tensor) -> None:
        err = fn(sink.data_ptr(), torch.cuda.current_stream().cuda_stream)
        if err:
            raise RuntimeError(f"icache sweep launch failed: cudaError {err}")

    return sweep


# ---- timing -------------------------------------------------------------------------------------
def call_order(order: str, n: int, reps: int) -> list[tuple[int, int]]:
    """(call, rep) in run order for n calls. rotate: every call takes every place in the round,
    rotated by the rep and reversed every other n reps (a fixed a b c / c b a order kept b in the
    middle, a place of its own); mirror: that older order, kept to compare runs measured with it;
    alone: each call's reps back to back, one call after the other (the C++ harness times each
    path so: a memset flush before every rep, the call's own code still in the instruction caches
    from its previous rep)."""
    if order == "alone":
        return [(i, r) for i in range(n) for r in range(reps)]
    run = []
    for r in range(reps):
        if order == "mirror":
            seq = list(range(n)) if r % 2 == 0 else list(reversed(range(n)))
        else:
            seq = [(i + r) % n for i in range(n)]
            if (r // n) % 2:
                seq.reverse()
        run += [(i, r) for i in seq]
    return run


def kineto_spans(acts: list[tuple[float, float]], reps: int, head: int) -> list[float]:
    """Per rep, the span of the call's GPU activities (us): acts are (start, end) in start order,
    each rep `head` activities (the flush's, pre's) and then the call's. The call's count must be
    the same in every rep, or the reps cannot be told apart."""
    group = len(acts) // reps if reps else 0
    if group <= head or len(acts) != reps * group:
        raise RuntimeError(f"kineto timing: {len(acts)} GPU activities in {reps} reps, {head} a rep "
                           "before the call: the call's activity count is not fixed")
    spans = []
    for r in range(reps):
        mine = acts[r * group + head:(r + 1) * group]
        spans.append(max(e for _, e in mine) - mine[0][0])
    return spans


class Timer:
    """L2-flushed timing shared by both libraries (per call: the median over the reps, or with
    ``kineto`` the mean, in microseconds).

    By default calls timed together are interleaved, each round in another order (a b, b a, b a,
    a b, ...; three calls: all six orders): the clock and power state a call sees, and the call it
    follows, then depend on no library's place in the run. Timing one library's reps after the
    other's (``--order alone``) gives the second a hotter GPU under the board power cap, and every
    call its own code in the instruction caches.

    ``method="kineto"`` is FlashMLA's own benchmark in full (kernelkit ``bench_kineto``, behind its
    test files' figures and issue 18's): each call alone, an 8 GB memset before every rep, one
    unprofiled pass of the reps, then a profiled pass; a rep's time is its kernels' span on the
    GPU (first kernel's start to last kernel's end, CUPTI timestamps, launch latency excluded),
    and a call's time the mean over the reps."""

    KINETO_FLUSH_BYTES = 8_000_000_000  # kernelkit's flush: int(8e9 // 4) int32 zeroed

    def __init__(self, reps: int, warmup: int, graph: bool, order: str = "rotate", flush: str = "memset",
                 method: str = "events"):
        self.reps, self.warmup, self.graph, self.order, self.method = reps, warmup, graph, order, method
        self.stat = statistics.mean if method == "kineto" else statistics.median
        nbytes = self.KINETO_FLUSH_BYTES if method == "kineto" else FLUSH_BYTES
        self.flush_buf = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        self._n_flush: int | None = None  # kineto: GPU activities of one flush (profiled once)
        # --flush icache: after the memset, 256 KB of code on every SM, so no call finds its own
        # instructions cached from the call before it (the memset leaves them; which call ran
        # before a call then depends on --order).
        self.icache = icache_sweep() if flush == "icache" else None

    def _prepare(self, fn: Callable[[], object]) -> Callable[[], object]:
        for _ in range(self.warmup):
            fn()
        if not self.graph:
            return fn
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()  # a last eager call on the capture stream (lazy init, allocator pools)
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        g.replay()
        return g.replay

    def _flush(self) -> None:
        self.flush_buf.zero_()  # the host enqueues the call while the GPU runs the flush
        if self.icache:
            self.icache(self.flush_buf)

    def _run(self, calls: list[Callable[[], object]],
             pre: dict[int, Callable[[], object]] | None = None) -> list[list[float]]:
        """Each rep: flush, then (untimed) pre[i]() when given, then calls[i], timed."""
        if self.method == "kineto":
            return self._run_kineto(calls, pre or {})
        torch.cuda.synchronize()
        events: list[list[tuple]] = [[] for _ in calls]
        pre = pre or {}
        n = len(calls)
        for i, _rep in call_order(self.order, n, self.reps):
            self._flush()
            if i in pre:
                pre[i]()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            calls[i]()
            end.record()
            events[i].append((start, end))
        torch.cuda.synchronize()
        return [[s.elapsed_time(e) * 1e3 for s, e in ev] for ev in events]

    @staticmethod
    def _gpu_activities(fn: Callable[[], object]) -> list:
        """The GPU activities (kernels, memsets, copies) fn enqueues, in start order (CUPTI)."""
        from torch.autograd import DeviceType
        from torch.autograd.profiler_util import FunctionEvent
        from torch.profiler import ProfilerActivity, profile

        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        acts = [e for e in prof.events() if isinstance(e, FunctionEvent) and e.device_type == DeviceType.CUDA]
        return sorted(acts, key=lambda e: e.time_range.start)

    def _run_kineto(self, calls: list[Callable[[], object]], pre: dict[int, Callable[[], object]]) -> list[list[float]]:
        """kernelkit's bench_kineto per call. A rep's activities are the flush's, pre's and the
        call's, in that order on one stream; the flush's and pre's counts come from profiling
        them once, the call's is the rest of the rep."""
        if self._n_flush is None:
            self._n_flush = len(self._gpu_activities(self._flush))
        out = []
        for i, fn in enumerate(calls):
            head = self._n_flush + (len(self._gpu_activities(pre[i])) if i in pre else 0)

            def reps() -> None:
                for _ in range(self.reps):
                    self._flush()
                    if i in pre:
                        pre[i]()
                    fn()

            reps()  # kernelkit's unprofiled first pass
            acts = [(e.time_range.start, e.time_range.end) for e in self._gpu_activities(reps)]  # us
            out.append(kineto_spans(acts, self.reps, head))
        return out

    def times(self, calls: list[Callable[[], object]],
              pre: dict[int, Callable[[], object]] | None = None) -> list[float]:
        """Each call's time (median over the reps; mean with kineto, as kernelkit reports)."""
        return [self.stat(u) for u in self._run([self._prepare(f) for f in calls], pre)]

    def __call__(self, fn: Callable[[], object]) -> tuple[float, float, float]:
        us = self._run([self._prepare(fn)])[0]
        return self.stat(us), min(us), max(us)

    def pair(self, fa: Callable[[], object], fb: Callable[[], object]) -> tuple[float, float]:
        """Times of fa and fb timed together (interleaved, or one after the other)."""
        a, b = self.times([fa, fb])
        return a, b


def matmul_ceiling(timer: Timer) -> float:
    """bf16 8192^3 matmul TFLOP/s in this run (the tensor-core ceiling of the % column)."""
    n = 8192
    a = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
    med, _, _ = Timer(max(5, timer.reps // 4), 2, False)(lambda: a @ b)
    return 2.0 * n**3 / (med * 1e-6) / 1e12


def agreement(x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """(cosine distance, max |x - y|) of two outputs, in fp64."""
    x, y = x.double().flatten(), y.double().flatten()
    denom = float((x * x).sum() + (y * y).sum())
    cos = 1.0 - 2.0 * float((x * y).sum()) / denom if denom > 0 else 0.0
    return cos, float((x - y).abs().max())


# ---- cases --------------------------------------------------------------------------------------
@dataclasses.dataclass
class DecodeCase:
    B: int
    S: int
    H: int
    K: int
    s_kv: int
    eff_k: int = 0  # > 0: only the first eff_k entries are valid (the rest -1 / INT_MAX)
    quick: bool = True

    def shape(self) -> str:
        s = f"B={self.B} S_q={self.S} H={self.H} K={self.K} s_kv={self.s_kv} page={PAGE}"
        return s + (f" eff={self.eff_k}" if self.eff_k else "")


@dataclasses.dataclass
class PrefillCase:
    T: int
    H: int
    K: int
    N: int
    D: int = D_QK
    quick: bool = True

    def shape(self) -> str:
        return f"T={self.T} H={self.H} D_qk={self.D} K={self.K} N={self.N}"


DECODE_CASES = [
    *(DecodeCase(B, 2, 128, 2048, 32768, quick=B in (2, 128)) for B in (2, 64, 74, 128)),
    DecodeCase(256, 1, 128, 2048, 4096),
    DecodeCase(256, 1, 128, 2048, 4096, eff_k=1024),
    DecodeCase(256, 1, 128, 1024, 4096),  # the lower bound of the dynamic case (indices 1024 wide)
    *(DecodeCase(B, S, 64, 2048, 8192, quick=B in (1, 64)) for S in (1, 2, 4) for B in (1, 8, 64)),
    DecodeCase(128, 2, 128, 16384, 32768, quick=False),
]
PREFILL_CASES = [
    PrefillCase(4096, 128, 2048, 32768),
    PrefillCase(4096, 64, 2048, 32768),
    PrefillCase(4096, 128, 2048, 32768, D=512, quick=False),
]
# --prefill-sweep: where the time goes. Time against K at fixed T splits a CTA's time into a fixed
# part (Q load, pipeline fill, epilogue: the intercept) and a per-64-row-block part (the slope);
# N moves the kv working set against the 50 MB L2.
PREFILL_SWEEP = [
    *(PrefillCase(4096, H, K, 32768) for H in (128, 64) for K in (256, 512, 1024)),
    *(PrefillCase(4096, 128, 2048, N) for N in (8192, 131072)),
]


def decode_inputs(c: DecodeCase, gen: torch.Generator) -> dict:
    """q, a pow2 ds_mla_fp8 cache written by selkv (one contiguous region of s_kv tokens per batch
    row), and top-k indices sampled without repetition from each row's KV length (uniform in
    [s_kv / 2, s_kv], like the C++ harness)."""
    dev = "cuda"
    tokens = c.B * c.s_kv
    cache = selkv.empty_kv_cache(tokens // PAGE, PAGE, "ds_mla_fp8", device=dev)
    chunk = 1 << 20
    for t0 in range(0, tokens, chunk):
        n = min(chunk, tokens - t0)
        latent = (torch.randn(n, 512, generator=gen, device=dev) / 10).bfloat16()
        rope = (torch.randn(n, 64, generator=gen, device=dev) / 10).bfloat16()
        slots = torch.arange(t0, t0 + n, dtype=torch.int64, device=dev)
        selkv.write_kv_cache(latent, rope, slots, cache)
    lens = torch.randint(c.s_kv // 2, c.s_kv + 1, (c.B,), generator=gen, device=dev)
    idx = torch.empty(c.B, c.S, c.K, dtype=torch.int32, device=dev)
    pos = torch.arange(c.s_kv, device=dev)
    for b in range(c.B):
        r = torch.rand(c.S, c.s_kv, generator=gen, device=dev)
        r[:, pos >= lens[b]] = 2.0  # never chosen while K <= len
        idx[b] = (r.argsort(dim=-1)[:, : c.K] + b * c.s_kv).int()
    q = torch.randn(c.B, c.S, c.H, D_QK, generator=gen, device=dev).bfloat16()
    out = {"q": q, "cache": cache, "indices": idx, "topk_length": None}
    if c.eff_k:
        fixed = idx.clone()
        fixed[..., c.eff_k :] = -1  # FlashMLA and selkv's fixed path: invalid suffix
        dyn = idx.clone()
        dyn[..., c.eff_k :] = torch.iinfo(torch.int32).max  # must never be read
        out.update(indices=fixed, indices_dyn=dyn,
                   topk_length=torch.full((c.B,), c.eff_k, dtype=torch.int32, device=dev))
    return out


def prefill_inputs(c: PrefillCase, gen: torch.Generator) -> dict:
    dev = "cuda"
    q = torch.randn(c.T, c.H, c.D, generator=gen, device=dev).bfloat16()
    kv = (torch.randn(c.N, c.D, generator=gen, device=dev) / 10).bfloat16()
    idx = torch.empty(c.T, c.K, dtype=torch.int32, device=dev)
    step = 256  # tokens per sampling batch (bounded temporary memory)
    for t0 in range(0, c.T, step):
        n = min(step, c.T - t0)
        idx[t0 : t0 + n] = torch.rand(n, c.N, generator=gen, device=dev).topk(c.K, dim=-1).indices.int()
    return {"q": q, "kv": kv, "indices": idx}


# ---- runners ------------------------------------------------------------------------------------
@dataclasses.dataclass
class Row:
    op: str
    shape: str
    variant: str
    selkv_us: float
    fm_us: float | None
    flops: float
    cos: float | None = None
    max_abs: float | None = None


def run_decode(c: DecodeCase, fm, timer: Timer, gen: torch.Generator, min_blocks: int,
               probe_pairing: bool = False) -> list[Row]:
    x = decode_inputs(c, gen)
    q, cache, idx = x["q"], x["cache"], x["indices"]
    scale = D_QK**-0.55
    k_valid = c.eff_k or c.K
    flops = 2.0 * c.H * c.B * c.S * k_valid * (D_QK + D_V)
    rows = []

    md = selkv.get_decode_metadata(c.B, c.S, c.H, c.K, min_blocks_per_part=min_blocks)
    ours = lambda: selkv.sparse_mla_decode(q, cache, idx, md, scale)  # noqa: E731
    ref_out = None
    if fm is not None:
        fm_cache = cache.view(torch.float8_e4m3fn).unsqueeze(2)  # [blocks, page, 1, 656]
        sched, _ = fm.get_mla_metadata()

        def theirs():
            return fm.flash_mla_with_kvcache(q, fm_cache, None, None, D_V, sched, None, scale, False, True, idx)

        ref_out = theirs()[0]
    out = ours()[0]
    cos, mad = agreement(out, ref_out) if ref_out is not None else (None, None)
    if fm is not None:
        s_med, f_med = timer.pair(ours, theirs)
    else:
        s_med, f_med = timer(ours)[0], None
    variant = "fixed" + (" -1 suffix" if c.eff_k else "")
    rows.append(Row("decode", c.shape(), variant, s_med, f_med, flops, cos, mad))
    if probe_pairing:
        # Where does the interleaving cost come from? selkv alone, and selkv interleaved with itself
        # (a second plan and workspace on the same tensors), next to the row above.
        md2 = selkv.get_decode_metadata(c.B, c.S, c.H, c.K, min_blocks_per_part=min_blocks)
        ours2 = lambda: selkv.sparse_mla_decode(q, cache, idx, md2, scale)  # noqa: E731
        rows.append(Row("decode", c.shape(), variant + ", selkv alone", timer(ours)[0], None, flops, None, None))
        a_med, _ = timer.pair(ours, ours2)
        rows.append(Row("decode", c.shape(), variant + ", selkv interleaved with selkv", a_med, None, flops, None, None))
        if fm is not None:  # and FlashMLA alone: what the interleaving costs it
            rows.append(Row("decode", c.shape(), variant + ", flash_mla alone", float("nan"), timer(theirs)[0], flops,
                            None, None))

    if c.eff_k:  # selkv's dynamic top-k on the same shape (FlashMLA's SM90 V3.2 path has none)
        tl, dyn_idx = x["topk_length"], x["indices_dyn"]
        md_dyn = selkv.get_decode_metadata(c.B, c.S, c.H, c.K, tl, min_blocks_per_part=min_blocks)
        dyn = lambda: selkv.sparse_mla_decode(q, cache, dyn_idx, md_dyn, scale, topk_length=tl)  # noqa: E731
        cos_d, mad_d = agreement(dyn()[0], ref_out if ref_out is not None else out)
        rows.append(Row("decode", c.shape(), "dynamic topk_length, INT_MAX suffix (vs FlashMLA fixed)",
                        timer(dyn)[0], f_med, flops, cos_d, mad_d))
    return rows


# Seed 000's packed grid (C6): K = 2048, B x S_q x H, request-disjoint KV (each batch row's tokens
# in its own region), every entry valid.
PACKED_CASES = [DecodeCase(B, S, H, 2048, 8192, quick=S in (1, 4, 16)) for H in (64, 128)
                for B in (1, 2, 4, 7, 8) for S in (1, 2, 3, 4, 8, 16)]


def run_packed(c: DecodeCase, fm, timer: Timer, gen: torch.Generator) -> list[Row]:
    """selkv native, selkv packed (buffer packed outside the timed call), pack + packed, the pack
    alone, a device copy of the pack's bytes and FlashMLA's native decode, timed interleaved (one
    run, one clock state). Rows carry FlashMLA's time as the anchor; the pack row carries the copy's."""
    x = decode_inputs(c, gen)
    q, cache, idx = x["q"], x["cache"], x["indices"]
    scale = D_QK**-0.55
    flops = 2.0 * c.H * c.B * c.S * c.K * (D_QK + D_V)
    md = selkv.get_decode_metadata(c.B, c.S, c.H, c.K)
    packed = selkv.pack_selected_kv(cache, idx)
    record_bytes = c.B * c.S * c.K * RECORD_BYTES
    src = torch.empty(record_bytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    native = lambda: selkv.sparse_mla_decode(q, cache, idx, md, scale)  # noqa: E731
    pk = lambda: selkv.sparse_mla_decode_packed(q, packed, md, scale, topk=c.K)  # noqa: E731
    pack = lambda: selkv.pack_selected_kv(cache, idx, out=packed)  # noqa: E731

    def both():
        pack()
        return pk()

    copy = lambda: dst.copy_(src)  # noqa: E731
    # calls[5]: the packed decode timed as seed 000's benchmark does, the pack run (untimed) after
    # the flush and right before it: the runtime pattern (pack in the overlap window, attention
    # next), where the buffer the pack just wrote is still in L2 as far as it fits (60 MB).
    calls = [native, pk, both, pack, copy, pk]
    pre = {5: pack}
    out_n, out_p = native()[0], pk()[0]
    if not torch.equal(out_n, out_p):
        raise RuntimeError(f"{c.shape()}: packed decode differs from native decode")
    cos = mad = None
    if fm is not None:
        fm_cache = cache.view(torch.float8_e4m3fn).unsqueeze(2)
        sched, _ = fm.get_mla_metadata()
        theirs = lambda: fm.flash_mla_with_kvcache(q, fm_cache, None, None, D_V, sched, None, scale, False, True, idx)  # noqa: E731
        cos, mad = agreement(out_p, theirs()[0])
        calls.append(theirs)
    med = timer.times(calls, pre)
    f_med = med[6] if fm is not None else None
    rows = [Row("packed", c.shape(), "native", med[0], f_med, flops, cos, mad),
            Row("packed", c.shape(), "packed", med[1], f_med, flops, cos, mad),
            Row("packed", c.shape(), "packed, packed after the flush", med[5], f_med, flops, cos, mad),
            Row("packed", c.shape(), "pack+packed", med[2], f_med, flops, cos, mad),
            Row("packed", c.shape(), "pack (anchor: device copy)", med[3], med[4], 0.0)]
    return rows


def packed_summary(rows: list[Row]) -> list[str]:
    """Geometric means of the packed grid: packed / native, packed vs FlashMLA, pack + packed /
    native, pack / copy; wins = cases where the first is faster."""
    by = {}
    for r in rows:
        if r.op == "packed":
            by.setdefault(r.shape, {})[r.variant] = r
    out = []

    def gm(pairs):
        v = [a / b for a, b in pairs if a and b]
        return (math.exp(sum(math.log(x) for x in v) / len(v)), sum(1 for x in v if x > 1), len(v)) if v else None

    for name, pairs in [
        ("native / packed (speedup of the packed stage, buffer cold)", [(d["native"].selkv_us, d["packed"].selkv_us) for d in by.values()]),
        ("native / packed (seed 000 method: packed after the flush)",
         [(d["native"].selkv_us, d["packed, packed after the flush"].selkv_us) for d in by.values()]),
        ("flash_mla / packed (buffer cold)", [(d["packed"].fm_us, d["packed"].selkv_us) for d in by.values()]),
        ("flash_mla / packed (seed 000 method)",
         [(d["packed"].fm_us, d["packed, packed after the flush"].selkv_us) for d in by.values()]),
        ("flash_mla / native", [(d["native"].fm_us, d["native"].selkv_us) for d in by.values()]),
        ("native / (pack + packed)", [(d["native"].selkv_us, d["pack+packed"].selkv_us) for d in by.values()]),
        ("copy / pack", [(d["pack (anchor: device copy)"].fm_us, d["pack (anchor: device copy)"].selkv_us) for d in by.values()]),
    ]:
        g = gm(pairs)
        if g:
            out.append(f"{name}: geomean {g[0]:.3f}x, {g[1]}/{g[2]} cases > 1")
    return out


def run_prefill(c: PrefillCase, fm, timer: Timer, gen: torch.Generator) -> list[Row]:
    x = prefill_inputs(c, gen)
    q, kv, idx = x["q"], x["kv"], x["indices"]
    scale = c.D**-0.55
    flops = 2.0 * c.H * c.T * c.K * (c.D + D_V)
    ours = lambda: selkv.sparse_prefill(q, kv, idx, scale)  # noqa: E731
    out = ours()[0]
    cos = mad = f_med = None
    if fm is not None:
        kv3, idx3 = kv.unsqueeze(1), idx.unsqueeze(1)  # [N, 1, D], [T, 1, K]: same memory
        theirs = lambda: fm.flash_mla_sparse_fwd(q, kv3, idx3, scale)  # noqa: E731
        cos, mad = agreement(out, theirs()[0])
        s_med, f_med = timer.pair(ours, theirs)
    else:
        s_med = timer(ours)[0]
    return [Row("prefill", c.shape(), "bf16 kv", s_med, f_med, flops, cos, mad)]


# ---- MODEL1 (issue 18) ---------------------------------------------------------------------------
M1_D = 512  # MODEL1 d_qk = d_v: 448 FP8 NoPE + 64 bf16 RoPE


@dataclasses.dataclass
class Model1Case:
    B: int
    H: int
    K: int
    page: int
    s_kv: int
    K2: int = 0  # extra cache top-k; 0: no extra cache
    page2: int = 0
    s_kv2: int = 0
    extra_len: bool = False  # extra_topk_length uniform in [0, K2] per batch row
    S: int = 2
    quick: bool = True
    extra_len_fixed: tuple[int, ...] = ()  # --extra-len-sweep: lengths set by hand, cycled over B

    def shape(self) -> str:
        s = f"model1 B={self.B} S_q={self.S} H={self.H} K={self.K} s_kv={self.s_kv} page={self.page}"
        if self.K2:
            s += f" extra K2={self.K2} s_kv2={self.s_kv2} page2={self.page2}"
            s += " extra_topk_length" if self.extra_len else ""
            if self.extra_len and self.extra_len_fixed:
                s += " lengths=" + ",".join(str(v) for v in self.extra_len_fixed)
        return s


# FlashMLA's test file (tests/test_flash_mla_sparse_decoding.py, gen_testcase): the MODEL1
# production configs (S_q 2, s_k = extra s_k = 16384, main pages of 256, topk 128, attn_sink on)
# and the d_qk 512 peak cases (pages of 64, no extra cache).
_M1_CONFIGS = (  # (H, K2, page2, extra_topk_length): CONFIG1..4
    (64, 512, 64, False),
    (128, 1024, 64, False),
    (64, 1024, 2, True),
    (128, 1024, 2, True),
)
MODEL1_CASES = [
    *(Model1Case(B, H, 128, 256, 16384, K2, page2, 16384, xl, quick=B in (2, 128))
      for (H, K2, page2, xl) in _M1_CONFIGS for B in (2, 64, 74, 128, 148, 256)),
    *(Model1Case(148, H, 16384, 64, 32768, quick=H == 128) for H in (64, 128)),
]


def model1_side(B: int, S: int, K: int, page: int, s_kv: int, gen: torch.Generator,
                dev: str | torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """One paged model1_fp8 cache written by selkv's C1 writer (randn / 10, pow2 UE8M0 scales),
    request-disjoint: batch row b's s_kv positions live in its own ceil(s_kv / page) pages, placed
    by a random page permutation (a shuffled block table, as FlashMLA's test makes). Each query
    row selects K distinct positions of its row's length (uniform in [s_kv / 2, s_kv]; -1 where the
    row is shorter than K) as physical slots. Returns (cache [blocks, page, 584] uint8 view of the
    padded pages, indices int32 [B, S, K])."""
    bpr = -(-s_kv // page)  # pages per batch row
    nb = B * bpr
    cache = selkv.empty_kv_cache(nb, page, "model1_fp8", device=dev)
    tokens, chunk = nb * page, 1 << 20
    for t0 in range(0, tokens, chunk):
        n = min(chunk, tokens - t0)
        latent = (torch.randn(n, 448, generator=gen, device=dev) / 10).bfloat16()
        rope = (torch.randn(n, 64, generator=gen, device=dev) / 10).bfloat16()
        slots = torch.arange(t0, t0 + n, dtype=torch.int64, device=dev)
        selkv.write_kv_cache(latent, rope, slots, cache, "model1_fp8")
    perm = torch.randperm(nb, generator=gen, device=dev)
    lens = torch.randint(s_kv // 2, s_kv + 1, (B,), generator=gen, device=dev)
    pos_all = torch.arange(s_kv, device=dev)
    idx = torch.empty(B, S, K, dtype=torch.int32, device=dev)
    rows_per_step = max(1, (64 << 20) // (S * s_kv * 8))  # bounded temporaries (argsort: int64)
    for b0 in range(0, B, rows_per_step):
        b1 = min(B, b0 + rows_per_step)
        r = torch.rand(b1 - b0, S, s_kv, generator=gen, device=dev)
        beyond = pos_all[None, :] >= lens[b0:b1, None]  # [b, s_kv]
        r.masked_fill_(beyond[:, None, :], 2.0)  # chosen only when the row is shorter than K
        pos = r.argsort(dim=-1)[..., :K]  # [b, S, K]
        rows = torch.arange(b0, b1, device=dev)[:, None, None]
        slot = perm[rows * bpr + pos // page] * page + pos % page
        valid = r.gather(-1, pos) < 1.5  # not a position past the row's length
        idx[b0:b1] = torch.where(valid, slot, -1).int()
    return cache, idx


def model1_inputs(c: Model1Case, gen: torch.Generator, dev: str | torch.device = "cuda") -> dict:
    """q, attn_sink, the main cache + indices, and the extra cache + indices (+ extra_topk_length,
    whose suffix keeps valid slots: FlashMLA's test convention, neither library may read them)."""
    cache, idx = model1_side(c.B, c.S, c.K, c.page, c.s_kv, gen, dev)
    x = {"q": torch.randn(c.B, c.S, c.H, M1_D, generator=gen, device=dev).bfloat16(),
         "sink": torch.randn(c.H, generator=gen, device=dev), "cache": cache, "indices": idx,
         "extra_cache": None, "extra_indices": None, "extra_topk_length": None}
    if c.K2:
        x["extra_cache"], x["extra_indices"] = model1_side(c.B, c.S, c.K2, c.page2, c.s_kv2, gen, dev)
        if c.extra_len:
            x["extra_topk_length"] = torch.randint(0, c.K2 + 1, (c.B,), generator=gen, device=dev,
                                                   dtype=torch.int32)
            if c.extra_len_fixed:  # same inputs otherwise: the draw above keeps the generator's stream
                v = [min(max(c.extra_len_fixed[b % len(c.extra_len_fixed)], 0), c.K2) for b in range(c.B)]
                x["extra_topk_length"] = torch.tensor(v, dtype=torch.int32, device=dev)
    return x


def model1_flops(c: Model1Case, x: dict) -> float:
    """FlashMLA's convention: 2 * H * attended tokens * (d_qk + d_v), valid entries only."""
    n = int((x["indices"] >= 0).sum())
    if x["extra_indices"] is not None:
        ok = x["extra_indices"] >= 0
        if x["extra_topk_length"] is not None:
            k = torch.arange(c.K2, device=ok.device)
            ok &= k[None, None, :] < x["extra_topk_length"][:, None, None]
        n += int(ok.sum())
    return 2.0 * c.H * n * (M1_D + M1_D)


def model1_calls(c: Model1Case, x: dict, fm, min_blocks: int) -> dict[str, Callable[[], object]]:
    """The calls on x: "ops" (selkv's plan + decode, plan made here, outside any timing),
    "shim" (selkv.flash_mla with FlashMLA's arguments; plans at its first call), "fm" (FlashMLA,
    when importable; schedules at its first call). All return (out [B, S, H, 512], lse)."""
    from selkv import flash_mla as shim_mod

    scale = M1_D**-0.55  # FlashMLA's test: d_qk ** -0.55
    q, sink, cache, idx = x["q"], x["sink"], x["cache"], x["indices"]
    xc, xi, xl = x["extra_cache"], x["extra_indices"], x["extra_topk_length"]
    md = selkv.get_decode_metadata(c.B, c.S, c.H, c.K, None, min_blocks_per_part=min_blocks,
                                   device=q.device, extra_topk=c.K2, extra_topk_length=xl)
    calls = {"ops": lambda: selkv.sparse_mla_decode(q, cache, idx, md, scale, attn_sink=sink,
                                                    extra_kv_cache=xc, extra_indices=xi,
                                                    extra_topk_length=xl)}
    # FlashMLA's cache argument: [blocks, page, 1, 584] float8 over the same padded pages
    fm_view = lambda t: None if t is None else t.view(torch.float8_e4m3fn).unsqueeze(2)  # noqa: E731
    args = (q, fm_view(cache), None, None, M1_D, None, scale, False, True, idx, sink, fm_view(xc), xi,
            None, xl)
    sched_s, _ = shim_mod.get_mla_metadata()
    calls["shim"] = lambda: shim_mod.flash_mla_with_kvcache(*args[:5], sched_s, *args[5:])
    if fm is not None:
        sched_f, _ = fm.get_mla_metadata()
        calls["fm"] = lambda: fm.flash_mla_with_kvcache(*args[:5], sched_f, *args[5:])
    return calls


def run_model1(c: Model1Case, fm, timer: Timer, gen: torch.Generator, min_blocks: int) -> list[Row]:
    x = model1_inputs(c, gen)
    flops = model1_flops(c, x)
    calls = model1_calls(c, x, fm, min_blocks)
    out_o, lse_o = calls["ops"]()
    out_s, lse_s = calls["shim"]()  # lse: FlashMLA's [B, H, S_q] view
    note = f"shim vs ops: out {'bitwise equal' if torch.equal(out_o, out_s) else 'DIFFERS'}"
    cos = mad = cos_s = mad_s = f_med = None
    names = ["ops", "shim"]
    if fm is not None:
        out_f, lse_f = calls["fm"]()
        cos, mad = agreement(out_o, out_f)
        cos_s, mad_s = agreement(out_s, out_f)
        lf, lo = lse_f.transpose(1, 2), lse_o  # [B, S_q, H] both
        fin = torch.isfinite(lf) & torch.isfinite(lo)
        lse_diff = float((lf[fin].double() - lo[fin].double()).abs().max()) if bool(fin.any()) else 0.0
        same_inf = torch.equal(torch.isfinite(lf), torch.isfinite(lo))
        note += f"; lse vs flash_mla max abs {lse_diff:.2e}, same non-finite entries {same_inf}"
        names.append("fm")
    print(f"[model1] {c.shape()}: {note}")
    med = timer.times([calls[n] for n in names])
    if fm is not None:
        f_med = med[2]
    return [Row("model1", c.shape(), "selkv ops", med[0], f_med, flops, cos, mad),
            Row("model1", c.shape(), "selkv.flash_mla drop-in", med[1], f_med, flops, cos_s, mad_s)]


def model1_summary(rows: list[Row]) -> list[str]:
    """Per selkv variant: geometric mean of flash_mla / selkv over the MODEL1 cases and wins."""
    out = []
    for variant in ("selkv ops", "selkv.flash_mla drop-in"):
        v = [r.fm_us / r.selkv_us for r in rows if r.op == "model1" and r.variant == variant and r.fm_us]
        if v:
            g = math.exp(sum(math.log(a) for a in v) / len(v))
            out.append(f"flash_mla / {variant}: geomean {g:.3f}x, {sum(1 for a in v if a >= 1)}/{len(v)} cases "
                       "selkv at least as fast")
    return out


# ---- main ---------------------------------------------------------------------------------------
def import_flash_mla(name: str):
    try:
        return importlib.import_module(name)
    except ImportError as e:
        print(f"[compare] {name} not importable ({e}): selkv alone", file=sys.stderr)
        return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ops", default="decode,prefill", help="comma list of decode, packed, prefill, model1")
    ap.add_argument("--quick", action="store_true", help="the quick subset of the cases")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--graph", action="store_true", help="time CUDA-graph replays of the calls")
    ap.add_argument("--order", choices=["rotate", "mirror", "alone"], default="rotate",
                    help="order of the calls: rotate (interleaved, every call takes every place), "
                         "mirror (a b c, c b a: the order older result files were measured with) or alone "
                         "(each call's reps back to back: FlashMLA's own benchmark method)")
    ap.add_argument("--flush", choices=["memset", "icache"], default="memset",
                    help="before every timed call: memset (a 512 MiB memset, the L2 flush) or icache (the memset, then "
                         "256 KB of code on every SM: no call finds its own instructions cached; needs nvcc)")
    ap.add_argument("--timing", choices=["events", "kineto"], default="events",
                    help="events: CUDA events around each call, median of the reps; kineto: FlashMLA's own "
                         "benchmark in full (kernelkit bench_kineto: each call alone, 8 GB memset before every rep, "
                         "the call's kernel span from CUPTI, mean of the reps; --order is then ignored)")
    ap.add_argument("--min-blocks", type=int, default=0,
                    help="selkv decode (and model1) split granularity (0 = default)")
    ap.add_argument("--probe-pairing", action="store_true",
                    help="decode: also time selkv alone and interleaved with itself (the pairing cost)")
    ap.add_argument("--flash-mla-module", default="flash_mla")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--prefill-sweep", action="store_true",
                    help="add the K (256..1024) and N (8K, 128K) prefill sweep (fixed vs per-block cost)")
    ap.add_argument("--only", default="", help="regex: run only the cases whose shape matches (e.g. under ncu)")
    ap.add_argument("--extra-len-sweep", default="",
                    help="model1: the extra_topk_length cases again with lengths set by hand, one run per "
                         "';'-separated setting of comma-separated per-batch-row lengths (e.g. '0;64;214,290')")
    ap.add_argument("--csv", default="")
    args = ap.parse_args()
    picked = (lambda c: re.search(args.only, c.shape()) is not None) if args.only else (lambda c: True)
    if not torch.cuda.is_available():
        print("[compare] no CUDA device", file=sys.stderr)
        return 2
    ops = set(args.ops.split(","))
    fm = import_flash_mla(args.flash_mla_module)
    timer = Timer(args.reps, args.warmup, args.graph, args.order, args.flush, args.timing)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(args.seed)
    gpu, ghash = torch.cuda.get_device_name(), git_hash()
    flush = {"memset": ",l2-flush", "icache": ",l2-icache-flush"}[args.flush] + ("-8GB" if args.timing == "kineto" else "")
    timing = (("graph" if args.graph else "eager") + flush
              + (",mean,kineto" if args.timing == "kineto" else ",median," + {
                  "rotate": "interleaved", "mirror": "interleaved-mirror", "alone": "alone"}[args.order]))
    ceiling = matmul_ceiling(timer)
    rows: list[Row] = []
    with torch.inference_mode():
        if "decode" in ops:
            for c in DECODE_CASES:
                if (not args.quick or c.quick) and picked(c):
                    rows += run_decode(c, fm, timer, gen, args.min_blocks, args.probe_pairing)
                    torch.cuda.empty_cache()
        if "packed" in ops:
            for c in PACKED_CASES:
                if (not args.quick or c.quick) and picked(c):
                    rows += run_packed(c, fm, timer, gen)
                    torch.cuda.empty_cache()
        if "model1" in ops:
            # the drawn cases, then the extra_topk_length ones at each --extra-len-sweep setting
            sweep = ([tuple(int(v) for v in setting.split(",")) for setting in args.extra_len_sweep.split(";")]
                     if args.extra_len_sweep else [])
            cases = MODEL1_CASES + [dataclasses.replace(c, extra_len_fixed=lengths)
                                    for lengths in sweep for c in MODEL1_CASES if c.extra_len]
            for c in cases:
                if (not args.quick or c.quick) and picked(c):
                    rows += run_model1(c, fm, timer, gen, args.min_blocks)
                    torch.cuda.empty_cache()
        if "prefill" in ops:
            for c in PREFILL_CASES + (PREFILL_SWEEP if args.prefill_sweep else []):
                if (not args.quick or c.quick) and picked(c):
                    rows += run_prefill(c, fm, timer, gen)
                    torch.cuda.empty_cache()

    header = ["op", "shape", "variant", "selkv_us", "flash_mla_us", "flash_mla/selkv", "selkv_TFLOPS",
              "flash_mla_TFLOPS", "pct_of_matmul", "out_cos_diff", "out_max_abs_diff", "timing", "git_hash", "gpu"]
    table = [["ceiling_matmul", "8192^3 bf16", "torch.matmul", "", "", "", f"{ceiling:.1f}", "", "100.0", "", "",
              timing, ghash, gpu]]
    fmt = lambda v, spec: "" if v is None else format(v, spec)  # noqa: E731
    for r in rows:
        s_tf = r.flops / (r.selkv_us * 1e-6) / 1e12
        f_tf = r.flops / (r.fm_us * 1e-6) / 1e12 if r.fm_us and r.flops else None
        table.append([r.op, r.shape, r.variant, fmt(r.selkv_us, ".2f"), fmt(r.fm_us, ".2f"),
                      fmt(r.fm_us / r.selkv_us if r.fm_us else None, ".3f"), fmt(s_tf, ".1f"), fmt(f_tf, ".1f"),
                      fmt(100.0 * s_tf / ceiling, ".1f"), fmt(r.cos, ".2e"), fmt(r.max_abs, ".2e"), timing, ghash, gpu])
    for t in table:
        print(f"{t[0]:>14} {t[1]:<48} {t[2]:<28.28} selkv {t[3]:>9} us  flash_mla {t[4]:>9} us  ratio {t[5]:>6}"
              f"  cos {t[9]:>9}")
    for line in packed_summary(rows):
        print(f"[packed] {line}")
        table.append(["summary", line, "", "", "", "", "", "", "", "", "", timing, ghash, gpu])
    for line in model1_summary(rows):
        print(f"[model1] {line}")
        table.append(["summary", line, "", "", "", "", "", "", "", "", "", timing, ghash, gpu])
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(header)
            w.writerows(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
