// Argument rules of C9 merge_attn_states (selkv/merge.h). Header-only so the GPU entry point and
// the CPU oracle (src/reference, which cannot link the core library) apply the same rules.
#pragma once

#include <cstdint>

#include "common/check.h"
#include "common/overlap.h"
#include "selkv/merge.h"

namespace selkv::merge {

inline int merge_elem_bytes(MergeDtype d) {
  return d == MergeDtype::kFp32 ? 4 : 2;
}

// `op` names the caller in messages ("selkv::merge_attn_states" or the oracle's name).
// `device` adds the GPU's alignment rules (16-byte vectors); the oracle has no such need.
inline Status check_merge_params(const char* op, const MergeAttnStatesParams& p, bool device,
                                 bool* no_op) {
  const char* kOp = op;
  *no_op = false;
  SELKV_CHECK_ARG(p.num_shards >= 1 && p.num_shards <= kMaxMergeShards, "num_shards",
                  "must be in [1, ", kMaxMergeShards, "], got ", p.num_shards);
  SELKV_CHECK_ARG(p.dtype == MergeDtype::kBf16 || p.dtype == MergeDtype::kFp16 ||
                      p.dtype == MergeDtype::kFp32,
                  "dtype", "must be kBf16, kFp16 or kFp32, got ", int(p.dtype));
  SELKV_CHECK_ARG(p.num_tokens >= 0, "num_tokens", "must be >= 0, got ", p.num_tokens);
  SELKV_CHECK_ARG(p.num_heads >= 0, "num_heads", "must be >= 0, got ", p.num_heads);
  SELKV_CHECK_ARG(p.head_dim > 0 && p.head_dim % 8 == 0 && p.head_dim <= 65536, "head_dim",
                  "must be a positive multiple of 8 up to 65536, got ", p.head_dim);
  // Row indices are 32-bit on the device.
  SELKV_CHECK_ARG(p.num_tokens * int64_t(p.num_heads) < (int64_t(1) << 31), "num_tokens",
                  "num_tokens * num_heads must be < 2^31, got ", p.num_tokens, " * ", p.num_heads);
  if (p.num_tokens == 0 || p.num_heads == 0) {
    *no_op = true;
    return Status::Ok();
  }
  // Strides: non-negative (inputs may broadcast with 0); outputs are checked for aliasing below.
  SELKV_CHECK_ARG(p.outs_token_stride >= 0, "outs_token_stride", "must be >= 0, got ", p.outs_token_stride);
  SELKV_CHECK_ARG(p.outs_head_stride >= 0, "outs_head_stride", "must be >= 0, got ", p.outs_head_stride);
  SELKV_CHECK_ARG(p.lses_token_stride >= 0, "lses_token_stride", "must be >= 0, got ", p.lses_token_stride);
  SELKV_CHECK_ARG(p.lses_head_stride >= 0, "lses_head_stride", "must be >= 0, got ", p.lses_head_stride);
  SELKV_CHECK_ARG(p.out_token_stride >= 0, "out_token_stride", "must be >= 0, got ", p.out_token_stride);
  SELKV_CHECK_ARG(p.out_head_stride >= 0, "out_head_stride", "must be >= 0, got ", p.out_head_stride);
  SELKV_CHECK_ARG(p.lse_token_stride >= 0, "lse_token_stride", "must be >= 0, got ", p.lse_token_stride);
  SELKV_CHECK_ARG(p.lse_head_stride >= 0, "lse_head_stride", "must be >= 0, got ", p.lse_head_stride);

  const int64_t es = merge_elem_bytes(p.dtype);
  const int64_t vec = 16 / es;  // elements per 16-byte vector
  SELKV_CHECK_ARG(p.out != nullptr, "out", "must not be null");
  for (int i = 0; i < p.num_shards; ++i) {
    SELKV_CHECK_ARG(p.outs[i] != nullptr, "outs", "outs[", i, "] must not be null");
    SELKV_CHECK_ARG(p.lses[i] != nullptr, "lses", "lses[", i, "] must not be null");
  }
  if (device) {
    for (int i = 0; i < p.num_shards; ++i) {
      SELKV_CHECK_ARG(reinterpret_cast<uintptr_t>(p.outs[i]) % 16 == 0, "outs", "outs[", i,
                      "] must be 16-byte aligned");
      SELKV_CHECK_ARG(reinterpret_cast<uintptr_t>(p.lses[i]) % 4 == 0, "lses", "lses[", i,
                      "] must be 4-byte aligned");
    }
    SELKV_CHECK_ARG(reinterpret_cast<uintptr_t>(p.out) % 16 == 0, "out", "must be 16-byte aligned");
    SELKV_CHECK_ARG(reinterpret_cast<uintptr_t>(p.lse) % 4 == 0, "lse", "must be 4-byte aligned");
    SELKV_CHECK_ARG(p.outs_token_stride % vec == 0, "outs_token_stride",
                    "must be a multiple of 16 bytes (", vec, " elements), got ", p.outs_token_stride);
    SELKV_CHECK_ARG(p.outs_head_stride % vec == 0, "outs_head_stride",
                    "must be a multiple of 16 bytes (", vec, " elements), got ", p.outs_head_stride);
    SELKV_CHECK_ARG(p.out_token_stride % vec == 0, "out_token_stride",
                    "must be a multiple of 16 bytes (", vec, " elements), got ", p.out_token_stride);
    SELKV_CHECK_ARG(p.out_head_stride % vec == 0, "out_head_stride",
                    "must be a multiple of 16 bytes (", vec, " elements), got ", p.out_head_stride);
  }

  using detail::Dim;
  const Dim out_dims[3] = {{p.num_tokens, p.out_token_stride}, {p.num_heads, p.out_head_stride},
                           {p.head_dim, 1}};
  SELKV_RETURN_IF_ERROR(detail::check_no_self_overlap(op, "out", {out_dims[0], out_dims[1], out_dims[2]}));
  if (p.lse != nullptr) {
    SELKV_RETURN_IF_ERROR(detail::check_no_self_overlap(
        op, "lse", {Dim{p.num_tokens, p.lse_token_stride}, Dim{p.num_heads, p.lse_head_stride}}));
  }
  const auto out_ext = detail::extent_of(p.out, es, {out_dims[0], out_dims[1], out_dims[2]});
  const auto lse_ext = detail::extent_of(
      p.lse, 4, {Dim{p.num_tokens, p.lse_token_stride}, Dim{p.num_heads, p.lse_head_stride}});
  SELKV_RETURN_IF_ERROR(detail::check_disjoint(op, "lse", lse_ext, "out", out_ext));
  for (int i = 0; i < p.num_shards; ++i) {
    const auto in_ext = detail::extent_of(
        p.outs[i], es,
        {Dim{p.num_tokens, p.outs_token_stride}, Dim{p.num_heads, p.outs_head_stride}, Dim{p.head_dim, 1}});
    const auto in_lse_ext = detail::extent_of(
        p.lses[i], 4, {Dim{p.num_tokens, p.lses_token_stride}, Dim{p.num_heads, p.lses_head_stride}});
    SELKV_RETURN_IF_ERROR(detail::check_disjoint(op, "out", out_ext, "outs", in_ext));
    SELKV_RETURN_IF_ERROR(detail::check_disjoint(op, "out", out_ext, "lses", in_lse_ext));
    SELKV_RETURN_IF_ERROR(detail::check_disjoint(op, "lse", lse_ext, "outs", in_ext));
    SELKV_RETURN_IF_ERROR(detail::check_disjoint(op, "lse", lse_ext, "lses", in_lse_ext));
  }
  return Status::Ok();
}

}  // namespace selkv::merge
