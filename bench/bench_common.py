"""Helpers the Python benchmarks share (bench/dsa_step.py, bench/dcp_step.py,
bench/compare_flash_mla.py): the commit a CSV records, writing the CSV, a random finite
ds_mla_fp8 cache."""

from __future__ import annotations

import csv
import os
import subprocess

import torch


def git_hash() -> str:
    """SELKV_GIT_HASH (a device copy of the tree has no .git of its own), else this checkout's."""
    env = os.environ.get("SELKV_GIT_HASH")
    if env:
        return env
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=os.path.dirname(os.path.abspath(__file__)), check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def write_csv(path: str, rows: list[dict]) -> None:
    """Rows of one shape (the first row's keys are the header)."""
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def random_ds_mla_cache(selkv, num_blocks: int, page: int, device, seed: int | None = None) -> torch.Tensor:
    """A ds_mla_fp8 cache of random finite records, made on `device`: E4M3 bytes below 0x78 (no
    0x7F / 0xFF NaN), tile scales 1/64, bf16 RoPE from a normal draw (`seed`: a fixed draw)."""
    gen = None
    if seed is not None:
        gen = torch.Generator(device=device)
        gen.manual_seed(seed)
    cache = selkv.empty_kv_cache(num_blocks, page, device=device)
    flat = cache.view(num_blocks * page, 656)
    cache.random_(0, 120, generator=gen)
    flat[:, 512:528].view(torch.float32).fill_(1.0 / 64)
    flat[:, 528:].view(torch.bfloat16).normal_(generator=gen)
    return cache
