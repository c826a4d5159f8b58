"""selkv: selected-KV (sparse) attention kernels and FP8 KV-cache operations for Hopper GPUs.

Importing the package loads the compiled operator library, which registers the
``torch.ops.selkv.*`` operators (see :mod:`selkv._ops` for where it is looked up). The
functions here are documented wrappers over those operators that allocate outputs when no
``out=`` is given; the operators themselves are out-variants usable directly, under CUDA graphs
and under ``torch.compile``.

Modules:
    :mod:`selkv.formats`    -- KV record layouts and constants (656 / 528-byte records)
    :mod:`selkv.cache_ops`  -- cache write, index conversion, gather + upconvert
    :mod:`selkv.decode`     -- sparse MLA decode over the FP8 cache (plan + decode), and over
                               a packed KV buffer (sparse_mla_decode_packed)
    :mod:`selkv.merge`      -- LSE merge of partial attention results (and vLLM's form)
    :mod:`selkv.packed`     -- packed selected-KV buffers: pack the selected records, patch entries
    :mod:`selkv.qsa`        -- QSA sparse prefill over selected 4-token blocks of a paged fp16 / bf16
                               cache, and its page-4 plan (qsa_plan / qsa_metadata_size / qsa_page4_wanted / qsa_workspace_size)
    :mod:`selkv.flash_mla`  -- FlashMLA-compatible names (drop-in import)
    :mod:`selkv.dsa`        -- one DSA attention step for a mixed batch (plan / run)
    :mod:`selkv.dcp`        -- decode context parallelism: sharded cache, all-gather + C9 merge
"""

from __future__ import annotations

from ._ops import load_library as _load_library

_load_library()

from . import decode, flash_mla, formats  # noqa: E402
from . import dcp, dsa, merge, packed, prefill, qsa  # noqa: E402
from ._ops import library_path  # noqa: E402
from .cache_ops import (  # noqa: E402
    convert_req_indices_to_slots,
    empty_kv_cache,
    gather_kv_bf16,
    write_kv_cache,
)
from .decode import (  # noqa: E402
    DecodeMetadata,
    decode_metadata_size,
    get_decode_metadata,
    sparse_mla_decode,
    sparse_mla_decode_packed,
)
from .dsa import DsaAttention, DsaPlan, DsaPolicy  # noqa: E402
from .merge import merge_attn_states, merge_attn_states_vllm  # noqa: E402
from .qsa import qsa_metadata_size, qsa_page4_wanted, qsa_plan, qsa_sparse_prefill, qsa_workspace_size  # noqa: E402
from .packed import pack_selected_kv, packed_kv_workspace_size, patch_packed_kv  # noqa: E402
from .prefill import dequant_prefill_workspace_size, dequant_selected, dequant_selected_workspace_rows, dequant_sparse_prefill, gather_prefill_workspace_size, gather_sparse_prefill, sparse_prefill  # noqa: E402,E501
from .formats import (  # noqa: E402
    DS_MLA_FP8_RECORD_BYTES,
    FORMATS,
    MODEL1_FP8_RECORD_BYTES,
    NOPE_FP8_RECORD_BYTES,
    SCALE_MODES,
    dequant_dim,
    page_bytes,
    record_bytes,
)

try:  # the version of the installed distribution (CMakeLists.txt's project version)
    from importlib.metadata import version as _dist_version

    __version__ = _dist_version("selkv")
except Exception:  # running from a source tree
    __version__ = "0+unknown"

__all__ = [
    *prefill.__all__, "prefill",
    "DS_MLA_FP8_RECORD_BYTES",
    "DecodeMetadata",
    "DsaAttention",
    "DsaPlan",
    "DsaPolicy",
    "MODEL1_FP8_RECORD_BYTES",
    "NOPE_FP8_RECORD_BYTES",
    "FORMATS",
    "SCALE_MODES",
    "convert_req_indices_to_slots",
    "dcp",
    "decode",
    "decode_metadata_size",
    "dsa",
    "dequant_dim",
    "empty_kv_cache",
    "flash_mla",
    "formats",
    "gather_kv_bf16",
    "get_decode_metadata",
    "library_path",
    "merge",
    "merge_attn_states",
    "merge_attn_states_vllm",
    "pack_selected_kv",
    "packed",
    "packed_kv_workspace_size",
    "patch_packed_kv",
    "qsa",
    "qsa_metadata_size",
    "qsa_page4_wanted",
    "qsa_plan",
    "qsa_sparse_prefill",
    "qsa_workspace_size",
    "record_bytes",
    "sparse_mla_decode",
    "sparse_mla_decode_packed",
    "write_kv_cache",
]
