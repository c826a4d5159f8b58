"""FlashMLA-compatible API (placeholder).

An inference engine that uses FlashMLA's Python API switches to selkv by changing an import::

    from selkv import flash_mla   # instead of: import flash_mla

The names below keep FlashMLA's signatures and conventions (including its result for query rows
with no valid index). They arrive with the sparse decode / prefill / packed-decode work; until
then each raises :class:`NotImplementedError`.

- ``get_mla_metadata`` -- split-KV scheduler metadata (computed on device, graph-capturable)
- ``flash_mla_with_kvcache`` -- sparse MLA decode over the paged ``ds_mla_fp8`` cache
- ``flash_mla_sparse_fwd`` -- sparse MLA prefill over bf16 KV
- ``get_packed_kv_workspace_size`` -- bytes needed by the packed selected-KV workspace
- ``get_packed_mla_metadata`` -- scheduler metadata for the packed path
- ``pack_selected_kv`` -- copy selected 656-byte records into the tile-major workspace
- ``flash_mla_with_packed_kvcache`` -- decode over the packed workspace
"""

from __future__ import annotations

from typing import Any, NoReturn

__all__ = [
    "get_mla_metadata",
    "flash_mla_with_kvcache",
    "flash_mla_sparse_fwd",
    "get_packed_kv_workspace_size",
    "get_packed_mla_metadata",
    "pack_selected_kv",
    "flash_mla_with_packed_kvcache",
]


def _not_yet(name: str) -> NoReturn:
    raise NotImplementedError(f"selkv.flash_mla.{name} is not implemented yet")


def get_mla_metadata(*args: Any, **kwargs: Any) -> Any:
    """FlashMLA ``get_mla_metadata``: scheduler metadata for sparse decode (not implemented yet)."""
    _not_yet("get_mla_metadata")


def flash_mla_with_kvcache(*args: Any, **kwargs: Any) -> Any:
    """FlashMLA ``flash_mla_with_kvcache``: sparse MLA decode (not implemented yet)."""
    _not_yet("flash_mla_with_kvcache")


def flash_mla_sparse_fwd(*args: Any, **kwargs: Any) -> Any:
    """FlashMLA ``flash_mla_sparse_fwd``: sparse MLA prefill (not implemented yet)."""
    _not_yet("flash_mla_sparse_fwd")


def get_packed_kv_workspace_size(*args: Any, **kwargs: Any) -> Any:
    """Workspace bytes of the packed selected-KV path (not implemented yet)."""
    _not_yet("get_packed_kv_workspace_size")


def get_packed_mla_metadata(*args: Any, **kwargs: Any) -> Any:
    """Scheduler metadata of the packed selected-KV path (not implemented yet)."""
    _not_yet("get_packed_mla_metadata")


def pack_selected_kv(*args: Any, **kwargs: Any) -> Any:
    """Packs selected records into the tile-major workspace (not implemented yet)."""
    _not_yet("pack_selected_kv")


def flash_mla_with_packed_kvcache(*args: Any, **kwargs: Any) -> Any:
    """Sparse MLA decode over the packed workspace (not implemented yet)."""
    _not_yet("flash_mla_with_packed_kvcache")
