// C5 host API: validation, metadata planning, dispatch to the SM90 instantiations + combine.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>

#include "common/arch.h"
#include "common/check.h"
#include "common/cuda_check.h"
#include "common/dispatch.h"
#include "common/overlap.h"
#include "common/sm_scale.h"
#include "decode/combine.h"
#include "decode/decode_params.h"
#include "decode/scheduler.h"
#include "decode/sm90/launch.h"
#include "selkv/decode.h"
#include "selkv/packed.h"
#include "packed/packed_layout.h"

namespace selkv {
namespace {

bool aligned16(const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 15u) == 0; }
bool aligned4(const void* ptr) { return (reinterpret_cast<uintptr_t>(ptr) & 3u) == 0; }

// Bound on a call's 64-token blocks and on min_blocks_per_part: a part walks up to all of them in
// int32 round counters (two rounds per block, stepped two at a time with a look-ahead of three),
// and the part count adds the granularity to the block total; 2^29 keeps all of it far from 2^31.
constexpr int64_t kMaxCallBlocks = int64_t(1) << 29;

// 64-token blocks of a row at full top-k (both caches; all of K for dynamic top-k), and of the
// whole call: the sizes the plan's defaults (granularity, partial format) are chosen from.
int32_t row_blocks(const DecodeShape& s) { return s.topk / decode::kBlockTokens + s.extra_topk / decode::kBlockTokens; }
int64_t call_blocks(const DecodeShape& s) { return int64_t(s.batch) * s.seq_q * row_blocks(s); }

bool known_partials(DecodePartials f) {
  return f == DecodePartials::kAuto || f == DecodePartials::kFp32 || f == DecodePartials::kFp16;
}

Status check_shape(const char* kOp, const DecodeShape& s) {
  SELKV_CHECK_ARG(s.batch >= 0, "batch", "must be >= 0, got ", s.batch);
  SELKV_CHECK_ARG(s.seq_q >= 0, "seq_q", "must be >= 0, got ", s.seq_q);
  SELKV_CHECK_ARG(s.num_heads == 64 || s.num_heads == 128, "num_heads",
                  "must be 64 or 128, got ", s.num_heads);
  SELKV_CHECK_ARG(s.topk >= decode::kBlockTokens && s.topk % decode::kBlockTokens == 0, "topk",
                  "must be a positive multiple of 64, got ", s.topk);
  // Row offsets (a block and the blocks read ahead of it) stay in int32.
  SELKV_CHECK_ARG(s.topk <= (int32_t(1) << 30), "topk", "must be <= 2^30, got ", s.topk);
  SELKV_CHECK_ARG(s.extra_topk >= 0 && s.extra_topk % decode::kBlockTokens == 0, "extra_topk",
                  "must be 0 (no extra cache) or a positive multiple of 64, got ", s.extra_topk);
  SELKV_CHECK_ARG(int64_t(s.topk) + s.extra_topk <= (int64_t(1) << 30), "extra_topk",
                  "topk + extra_topk must be <= 2^30, got ", int64_t(s.topk) + s.extra_topk);
  SELKV_CHECK_ARG(s.extra_topk_length == nullptr || s.extra_topk > 0, "extra_topk_length",
                  "given without an extra cache (extra_topk is 0)");
  SELKV_CHECK_ARG(call_blocks(s) <= kMaxCallBlocks, "batch",
                  "batch * seq_q * (topk + extra_topk) / 64 must be <= 2^29, got ", call_blocks(s));
  SELKV_CHECK_ARG(s.num_sms >= 0, "num_sms", "must be >= 0 (0 = current device), got ", s.num_sms);
  SELKV_CHECK_ARG(s.min_blocks_per_part >= 0 && s.min_blocks_per_part <= kMaxCallBlocks,
                  "min_blocks_per_part", "must be in [0, 2^29] (0 = default), got ",
                  s.min_blocks_per_part);
  SELKV_CHECK_ARG(known_partials(s.partials), "partials", "must be kAuto, kFp32 or kFp16, got ",
                  int(s.partials));
  return Status::Ok();
}

// The head counts with decode instantiations (src/decode/sm90/instantiations/*.cu); check_shape
// admits only these.
template <class Fn>
decltype(auto) dispatch_heads(int num_heads, Fn&& fn) {
  return detail::dispatch_value<64, 128>(num_heads, std::forward<Fn>(fn));
}

}  // namespace

size_t decode_metadata_size(int64_t batch, int64_t seq_q) {
  const int64_t rows = batch > 0 && seq_q > 0 ? batch * seq_q : 0;
  const int64_t b = batch > 0 ? batch : 0;
  // header and tables, prefix sums [rows + 1], the lengths snapshot [batch], K2 and the extra
  // cache's lengths snapshot [batch] (decode_params.h md_ints)
  const size_t bytes = size_t(decode::kMdPrefix + rows + 1 + b + 1 + b) * sizeof(int32_t);
  return (bytes + 15) & ~size_t(15);
}

bool decode_uses_f16_partials(const DecodeShape& s) {
  if (s.partials != DecodePartials::kAuto) return s.partials == DecodePartials::kFp16;
  return decode::f16_partials_by_default(s.num_heads, call_blocks(s));
}

size_t decode_workspace_size(const DecodeMetadata& md) {
  if (!md.valid) return 0;
  // accum_out (the partial slots, decode_params.h accum_out_floats), then accum_lse [2 * parts, H] fp32.
  const int64_t floats = decode::accum_out_floats(md.num_sm_parts, md.shape.num_heads, decode_uses_f16_partials(md.shape)) +
                         int64_t(2) * md.num_sm_parts * md.shape.num_heads;
  return size_t(floats) * sizeof(float);
}

Status make_decode_metadata(const DecodeShape& shape, void* buffer, size_t buffer_bytes,
                            DecodeMetadata* metadata, cudaStream_t stream) {
  constexpr const char* kOp = "selkv::make_decode_metadata";
  SELKV_CHECK_ARG(metadata != nullptr, "metadata", "must not be null");
  metadata->valid = false;
  SELKV_RETURN_IF_ERROR(check_shape(kOp, shape));
  if (int64_t(shape.batch) * shape.seq_q == 0) {
    // No rows (e.g. a mixed batch without decode rows): an empty plan, nothing launched or
    // written; the buffer is not needed and the decode call is a no-op.
    *metadata = DecodeMetadata{};
    metadata->data = static_cast<int32_t*>(buffer);
    metadata->bytes = buffer != nullptr ? buffer_bytes : 0;
    metadata->shape = shape;
    metadata->valid = true;
    return Status::Ok();
  }
  SELKV_CHECK_ARG(buffer != nullptr, "buffer", "must not be null");
  SELKV_CHECK_ARG((reinterpret_cast<uintptr_t>(buffer) & 15u) == 0, "buffer", "must be 16-byte aligned");
  const size_t need = decode_metadata_size(shape.batch, shape.seq_q);
  if (buffer_bytes < need)
    return Status(StatusCode::kWorkspaceTooSmall,
                  detail::concat(kOp, ": buffer: needs ", need, " bytes, got ", buffer_bytes));
  // The scheduler reads topk_length while it writes the plan.
  SELKV_RETURN_IF_ERROR(detail::check_disjoint(kOp, "buffer", detail::byte_range(buffer, int64_t(need)), "topk_length",
                                               detail::extent_of(shape.topk_length, 4, {{shape.batch, 1}})));
  SELKV_RETURN_IF_ERROR(detail::check_disjoint(kOp, "buffer", detail::byte_range(buffer, int64_t(need)),
                                               "extra_topk_length",
                                               detail::extent_of(shape.extra_topk_length, 4, {{shape.batch, 1}})));
  int num_sms = shape.num_sms;
  if (num_sms == 0) {
    int dev = 0;
    SELKV_CUDA_RETURN(cudaGetDevice(&dev), kOp);
    SELKV_CUDA_RETURN(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, dev), kOp);
  }
  const int groups = shape.num_heads / decode::kHeadsPerCta;
  int parts = num_sms / groups > 0 ? num_sms / groups : 1;
  if (parts > decode::kMaxDecodeParts) parts = decode::kMaxDecodeParts;
  if (shape.num_sms == 0) {
    // H = 128 runs as 2-CTA clusters: no more parts than clusters that fit at once (a GPC with an
    // odd SM count leaves one SM out), else a second wave doubles the time.
    int resident = 0;
    const cudaError_t e = dispatch_heads(shape.num_heads, [&](auto heads) {
      return decode::sm90::max_resident_sparse_decode_sm90<decltype(heads)::value>(parts, &resident);
    });
    if (e == cudaSuccess && resident >= 1 && resident < parts) parts = resident;
    (void)cudaGetLastError();
  }
  // Default granularity from the call's largest block count (dynamic top-k: the plan is made
  // before the lengths are known, so from K; a shorter length only makes the parts shorter).
  const int64_t max_blocks = call_blocks(shape);
  const bool fixed_topk = shape.topk_length == nullptr && shape.extra_topk_length == nullptr;
  const int32_t min_blocks =
      shape.min_blocks_per_part > 0 ? shape.min_blocks_per_part
      : fixed_topk ? decode::fixed_min_blocks_per_part(shape.num_heads, int32_t(max_blocks), row_blocks(shape), parts)
                   : decode::min_blocks_per_part(shape.num_heads, max_blocks);
  SELKV_CUDA_RETURN(decode::launch_decode_scheduler(shape.batch, shape.seq_q, shape.topk,
                                                    shape.topk_length, shape.extra_topk,
                                                    shape.extra_topk_length, parts, min_blocks,
                                                    shape.min_blocks_per_part == 0, static_cast<int32_t*>(buffer),
                                                    stream),
                    kOp);
  metadata->data = static_cast<int32_t*>(buffer);
  metadata->bytes = buffer_bytes;
  metadata->shape = shape;
  metadata->shape.num_sms = num_sms;
  metadata->num_sm_parts = parts;
  metadata->min_blocks_per_part = min_blocks;
  metadata->valid = true;
  return Status::Ok();
}

namespace {

// q's last dimension: the width of a dequantized record (576 ds_mla_fp8, 512 model1_fp8; the
// packed buffer holds ds_mla_fp8 records).
int64_t qk_dim(const SparseDecodeParams& p) { return fmt::dequant_dim(p.cache.format); }
int64_t qk_dim(const PackedDecodeParams&) { return fmt::kQkDim; }

// The contiguous [B, S_q, H, *] strides of q, out and lse (both decode params types).
template <class P>
void set_contiguous_qol_strides(P* p) {
  const int64_t H = p->num_heads, D = qk_dim(*p);
  p->q_head_stride = D;
  p->q_seq_stride = H * D;
  p->q_batch_stride = int64_t(p->seq_q) * H * D;
  p->out_head_stride = fmt::kVDim;
  p->out_seq_stride = H * fmt::kVDim;
  p->out_batch_stride = int64_t(p->seq_q) * H * fmt::kVDim;
  p->lse_seq_stride = H;
  p->lse_batch_stride = int64_t(p->seq_q) * H;
}

}  // namespace

void set_contiguous_strides(SparseDecodeParams* p) {
  set_contiguous_qol_strides(p);
  p->indices_seq_stride = p->topk;
  p->indices_batch_stride = int64_t(p->seq_q) * p->topk;
  p->extra_indices_seq_stride = p->extra_topk;
  p->extra_indices_batch_stride = int64_t(p->seq_q) * p->extra_topk;
}

namespace {

// The byte extents of a decode's tensors, for the overlap rules (DESIGN §2). The KV source is
// the cache and the indices (native) or the packed KV buffer (packed, src1 empty).
struct DecodeExtents {
  detail::Extent q, src0, src1, topk_length, attn_sink, metadata, out, lse;
  detail::Extent extra_cache, extra_indices, extra_topk_length;  // native only
  const char* src0_name = "cache";
  const char* src1_name = "indices";
};

// The extents both paths share (P: SparseDecodeParams or PackedDecodeParams).
template <class P>
DecodeExtents common_extents(const P& p, const DecodeMetadata& md) {
  using detail::Dim;
  using detail::extent_of;
  const int64_t B = p.batch, S = p.seq_q, H = p.num_heads;
  DecodeExtents e;
  e.q = extent_of(p.q, 2, {Dim{B, p.q_batch_stride}, Dim{S, p.q_seq_stride}, Dim{H, p.q_head_stride}, Dim{qk_dim(p), 1}});
  e.topk_length = extent_of(p.topk_length, 4, {Dim{B, 1}});
  e.attn_sink = extent_of(p.attn_sink, 4, {Dim{H, 1}});
  e.metadata = detail::byte_range(md.data, int64_t(std::min<size_t>(md.bytes, size_t(INT64_MAX))));
  e.out = extent_of(p.out, 2, {Dim{B, p.out_batch_stride}, Dim{S, p.out_seq_stride}, Dim{H, p.out_head_stride}, Dim{fmt::kVDim, 1}});
  e.lse = extent_of(p.lse, 4, {Dim{B, p.lse_batch_stride}, Dim{S, p.lse_seq_stride}, Dim{H, 1}});
  return e;
}

DecodeExtents decode_extents(const SparseDecodeParams& p, const DecodeMetadata& md) {
  using detail::Dim;
  DecodeExtents e = common_extents(p, md);
  auto cache_extent = [](const PagedKvCache& c) {
    return c.num_blocks > 0 && c.data != nullptr
               ? detail::byte_range(c.data, (c.num_blocks - 1) * c.block_stride_bytes + fmt::page_bytes(c.format, c.page_size))
               : detail::Extent{};
  };
  e.src0 = cache_extent(p.cache);
  e.src1 = detail::extent_of(p.indices, 4, {Dim{p.batch, p.indices_batch_stride}, Dim{p.seq_q, p.indices_seq_stride}, Dim{p.topk, 1}});
  if (p.extra_topk > 0) {
    e.extra_cache = cache_extent(p.extra_cache);
    e.extra_indices = detail::extent_of(p.extra_indices, 4, {Dim{p.batch, p.extra_indices_batch_stride},
                                                              Dim{p.seq_q, p.extra_indices_seq_stride}, Dim{p.extra_topk, 1}});
    e.extra_topk_length = detail::extent_of(p.extra_topk_length, 4, {Dim{p.batch, 1}});
  }
  return e;
}

DecodeExtents decode_extents(const PackedDecodeParams& p, const DecodeMetadata& md) {
  DecodeExtents e = common_extents(p, md);
  e.src0 = detail::byte_range(p.packed_kv, int64_t(packed_kv_workspace_size(p.batch, p.seq_q, p.topk)));
  e.src0_name = "packed_kv";
  e.src1_name = "packed_kv";
  return e;
}

// `name` (an output or the workspace) against every input and the metadata.
Status check_disjoint_from_inputs(const char* kOp, const char* name, const detail::Extent& x,
                                  const DecodeExtents& e) {
  return detail::check_disjoint_from(kOp, name, x,
                                     {{"q", e.q}, {e.src0_name, e.src0}, {e.src1_name, e.src1},
                                      {"topk_length", e.topk_length}, {"attn_sink", e.attn_sink},
                                      {"metadata", e.metadata}, {"extra_cache", e.extra_cache},
                                      {"extra_indices", e.extra_indices},
                                      {"extra_topk_length", e.extra_topk_length}});
}

// The extra cache of a call (the packed buffer has none).
int32_t extra_topk_of(const SparseDecodeParams& p) { return p.extra_topk; }
int32_t extra_topk_of(const PackedDecodeParams&) { return 0; }
const int32_t* extra_topk_length_of(const SparseDecodeParams& p) { return p.extra_topk_length; }
const int32_t* extra_topk_length_of(const PackedDecodeParams&) { return nullptr; }

// The plan against the call, and the split workspace's size.
template <class P>
Status check_plan(const char* kOp, const P& p, const DecodeMetadata& md, size_t workspace_bytes) {
  SELKV_CHECK_ARG(md.valid, "metadata", "was not made by make_decode_metadata (or its creation failed)");
  const DecodeShape& m = md.shape;
  SELKV_CHECK_ARG(m.batch == p.batch && m.seq_q == p.seq_q && m.num_heads == p.num_heads &&
                      m.topk == p.topk,
                  "metadata", "made for (batch ", m.batch, ", seq_q ", m.seq_q, ", heads ",
                  m.num_heads, ", topk ", m.topk, ") but called with (", p.batch, ", ", p.seq_q,
                  ", ", p.num_heads, ", ", p.topk, ")");
  SELKV_CHECK_ARG(m.topk_length == p.topk_length, "metadata",
                  "made with a different topk_length (", m.topk_length == nullptr ? "none" : "a pointer",
                  ") than passed (", p.topk_length == nullptr ? "none" : "a pointer", ")");
  SELKV_CHECK_ARG(m.extra_topk == extra_topk_of(p), "metadata", "made for extra_topk ", m.extra_topk,
                  " but called with ", extra_topk_of(p));
  SELKV_CHECK_ARG(m.extra_topk_length == extra_topk_length_of(p), "metadata",
                  "made with a different extra_topk_length (", m.extra_topk_length == nullptr ? "none" : "a pointer",
                  ") than passed (", extra_topk_length_of(p) == nullptr ? "none" : "a pointer", ")");
  SELKV_CHECK_ARG(known_partials(m.partials), "metadata", "partials must be kAuto, kFp32 or kFp16, got ",
                  int(m.partials));
  if (int64_t(p.batch) * p.seq_q == 0) {
    // No rows: nothing is read or written, so no pointer is needed (a plan of 0 or more parts).
    SELKV_CHECK_ARG(md.num_sm_parts >= 0 && md.num_sm_parts <= decode::kMaxDecodeParts, "metadata",
                    "not made by make_decode_metadata");
  } else {
    SELKV_CHECK_ARG(md.data != nullptr && md.bytes >= decode_metadata_size(p.batch, p.seq_q) &&
                        md.num_sm_parts >= 1 && md.num_sm_parts <= decode::kMaxDecodeParts &&
                        md.min_blocks_per_part >= 1 && md.min_blocks_per_part <= kMaxCallBlocks,
                    "metadata", "buffer too small for this shape, or not made by make_decode_metadata");
    // The kernels read the plan's header and split-row table with 16-byte loads; a copy of the
    // plan at another offset would fault before the header check could reject it.
    SELKV_CHECK_ARG(aligned16(md.data), "metadata", "data must be 16-byte aligned");
  }
  const size_t need = decode_workspace_size(md);
  if (workspace_bytes < need)
    return Status(StatusCode::kWorkspaceTooSmall,
                  detail::concat(kOp, ": workspace: needs ", need, " bytes, got ", workspace_bytes));
  return Status::Ok();
}

template <class P>
Status check_q(const char* kOp, const P& p) {
  SELKV_CHECK_ARG(p.q != nullptr, "q", "must not be null");
  SELKV_CHECK_ARG(aligned16(p.q), "q", "must be 16-byte aligned");
  SELKV_CHECK_ARG(p.q_batch_stride >= 0 && p.q_seq_stride >= 0 && p.q_head_stride >= 0, "q",
                  "strides must be >= 0 (last dim contiguous)");
  SELKV_CHECK_ARG(p.q_batch_stride % 8 == 0 && p.q_seq_stride % 8 == 0 && p.q_head_stride % 8 == 0,
                  "q", "strides must be multiples of 8 elements (16-byte aligned rows), got (",
                  p.q_batch_stride, ", ", p.q_seq_stride, ", ", p.q_head_stride, ")");
  return Status::Ok();
}

// topk_length, attn_sink, out and lse, and the overlap rules.
template <class P>
Status check_aux_and_outputs(const char* kOp, const P& p, const DecodeMetadata& md) {
  SELKV_CHECK_ARG(aligned4(p.topk_length), "topk_length", "must be 4-byte aligned");
  SELKV_CHECK_ARG(aligned4(p.attn_sink), "attn_sink", "must be 4-byte aligned");
  // out / lse: as prefill's outputs, every (b, s, h) row has its own memory
  SELKV_CHECK_ARG(p.out != nullptr, "out", "must not be null");
  SELKV_CHECK_ARG(aligned16(p.out), "out", "must be 16-byte aligned");
  SELKV_CHECK_ARG(p.out_batch_stride >= 0 && p.out_seq_stride >= 0 && p.out_head_stride >= fmt::kVDim,
                  "out", "strides must be >= 0 and head stride >= 512 (last dim contiguous)");
  SELKV_CHECK_ARG(p.out_batch_stride % 8 == 0 && p.out_seq_stride % 8 == 0 && p.out_head_stride % 8 == 0,
                  "out", "strides must be multiples of 8 elements (16-byte aligned rows)");
  SELKV_CHECK_ARG(p.lse != nullptr, "lse", "must not be null");
  SELKV_CHECK_ARG(aligned4(p.lse), "lse", "must be 4-byte aligned");
  SELKV_CHECK_ARG(p.lse_batch_stride >= 0 && p.lse_seq_stride >= 0, "lse", "strides must be >= 0");
  using detail::Dim;
  SELKV_RETURN_IF_ERROR(detail::check_no_self_overlap(
      kOp, "out", {Dim{p.batch, p.out_batch_stride}, Dim{p.seq_q, p.out_seq_stride},
                   Dim{p.num_heads, p.out_head_stride}, Dim{fmt::kVDim, 1}}));
  SELKV_RETURN_IF_ERROR(detail::check_no_self_overlap(
      kOp, "lse", {Dim{p.batch, p.lse_batch_stride}, Dim{p.seq_q, p.lse_seq_stride}, Dim{p.num_heads, 1}}));
  const DecodeExtents e = decode_extents(p, md);
  SELKV_RETURN_IF_ERROR(detail::check_disjoint(kOp, "out", e.out, "lse", e.lse));
  SELKV_RETURN_IF_ERROR(check_disjoint_from_inputs(kOp, "out", e.out, e));
  SELKV_RETURN_IF_ERROR(check_disjoint_from_inputs(kOp, "lse", e.lse, e));
  return Status::Ok();
}

// Kernel parameters both paths share (the KV source is filled by the caller).
template <class P>
decode::DecodeKernelParams common_kernel_params(const P& p, const DecodeMetadata& md, void* workspace) {
  decode::DecodeKernelParams k{};
  k.q = static_cast<const uint16_t*>(p.q);
  k.q_batch_stride = p.q_batch_stride;
  k.q_seq_stride = p.q_seq_stride;
  k.q_head_stride = p.q_head_stride;
  k.batch = p.batch;
  k.seq_q = p.seq_q;
  k.num_heads = p.num_heads;
  k.topk = p.topk;
  k.num_rows = p.batch * p.seq_q;
  k.topk_length = p.topk_length;
  k.attn_sink = p.attn_sink;
  k.sm_scale = p.sm_scale;
  k.sm_scale_log2 = detail::sm_scale_log2(p.sm_scale);
  k.out = static_cast<uint16_t*>(p.out);
  k.out_batch_stride = p.out_batch_stride;
  k.out_seq_stride = p.out_seq_stride;
  k.out_head_stride = p.out_head_stride;
  k.lse = p.lse;
  k.lse_batch_stride = p.lse_batch_stride;
  k.lse_seq_stride = p.lse_seq_stride;
  k.empty_lse = p.empty_lse_pos_inf ? INFINITY : -INFINITY;
  k.metadata = md.data;
  k.num_sm_parts = md.num_sm_parts;
  k.min_blocks_per_part = md.min_blocks_per_part;
  k.accum_out = static_cast<float*>(workspace);  // accum_lse: launch_decode (it follows the partial format)
  return k;
}

// The workspace (16-byte aligned, disjoint from everything else) after the call's checks passed.
template <class P>
Status check_workspace(const char* kOp, const P& p, const DecodeMetadata& md, void* workspace) {
  SELKV_CHECK_ARG(workspace != nullptr, "workspace", "must not be null");
  SELKV_CHECK_ARG(aligned16(workspace), "workspace", "must be 16-byte aligned");
  // The split accumulators are written by the decode and read by the combine.
  const DecodeExtents e = decode_extents(p, md);
  const detail::Extent ws = detail::byte_range(workspace, int64_t(decode_workspace_size(md)));
  SELKV_RETURN_IF_ERROR(check_disjoint_from_inputs(kOp, "workspace", ws, e));
  return detail::check_disjoint_from(kOp, "workspace", ws, {{"out", e.out}, {"lse", e.lse}});
}

// The decode grid (one of the instantiations: ds_mla_fp8 native or packed, or model1_fp8) and,
// when rows can be split, the combine.
Status launch_decode(const char* kOp, decode::DecodeKernelParams k, const DecodeMetadata& md,
                     bool packed, KvFormat format, cudaStream_t stream) {
  const bool dyn = decode::has_lengths(k);
  const decode::FixedSchedule fixed(k.num_rows, k.topk + k.topk_extra, k.min_blocks_per_part, k.num_sm_parts);
  k.fixed = decode::FixedPartition(fixed);  // the fixed kernels' cut, made once here instead of in every CTA
  const bool f16 = decode_uses_f16_partials(md.shape);  // shape only: the same for every call of the plan
  k.accum_lse = k.accum_out + decode::accum_out_floats(k.num_sm_parts, k.num_heads, f16);
  const bool model1 = format == KvFormat::kModel1Fp8;   // (checked: packed reads ds_mla_fp8 only)
  const cudaError_t err = dispatch_heads(k.num_heads, [&](auto heads) {
    return detail::dispatch_bool(dyn, [&](auto dynamic) {
      return detail::dispatch_bool(f16, [&](auto f16c) {
        return detail::dispatch_bool(model1, [&](auto model1c) {
          constexpr int kH = decltype(heads)::value;
          constexpr bool kDyn = decltype(dynamic)::value, kF16 = decltype(f16c)::value;
          if constexpr (decltype(model1c)::value) {
            return decode::sm90::launch_sparse_decode_sm90<kH, kDyn, kF16, false, KvFormat::kModel1Fp8>(k, stream);
          } else {
            return detail::dispatch_bool(packed, [&](auto packedc) {
              return decode::sm90::launch_sparse_decode_sm90<kH, kDyn, kF16, decltype(packedc)::value>(k, stream);
            });
          }
        });
      });
    });
  });
  SELKV_CUDA_RETURN(err, kOp);
  // A fixed schedule of whole rows per part writes every row's out directly: no combine. Else
  // at most one row is split per boundary between parts, and at most every row.
  if (dyn || fixed.has_split_rows()) {
    const int32_t boundaries = (dyn ? k.num_sm_parts : fixed.np) - 1;
    SELKV_CUDA_RETURN(decode::launch_decode_combine(k, std::min(boundaries, k.num_rows), f16, stream), kOp);
  }
  return Status::Ok();
}

}  // namespace

namespace {

// A paged cache view the decode reads (`name`: "cache" or "extra_cache").
Status check_cache_view(const char* kOp, const char* name, const PagedKvCache& c) {
  SELKV_CHECK_ARG(c.data != nullptr, name, "data must not be null");
  SELKV_CHECK_ARG(aligned16(c.data), name, "data must be 16-byte aligned");
  SELKV_CHECK_ARG(c.num_blocks >= 1, name, "num_blocks must be >= 1, got ", c.num_blocks);
  SELKV_CHECK_ARG(c.page_size >= 1, name, "page_size must be >= 1, got ", c.page_size);
  // The kernel forms in-page byte offsets (model1_fp8: the page's scale tail) in 32 bits.
  SELKV_CHECK_ARG(fmt::page_bytes(c.format, c.page_size) < (int64_t(1) << 31), name,
                  "a page must be < 2^31 bytes, got page_size ", c.page_size);
  const int64_t need = fmt::page_bytes(c.format, c.page_size);
  SELKV_CHECK_ARG(c.block_stride_bytes >= need, name, "block_stride_bytes must be >= the ",
                  fmt::format_name(c.format), " page size of ", c.page_size, " tokens (", need,
                  " bytes), got ", c.block_stride_bytes);
  SELKV_CHECK_ARG(c.block_stride_bytes % 16 == 0, name,
                  "block_stride_bytes must be a multiple of 16, got ", c.block_stride_bytes);
  SELKV_CHECK_ARG(c.num_blocks <= std::numeric_limits<int64_t>::max() / c.block_stride_bytes, name,
                  "num_blocks * block_stride_bytes overflows int64");
  return Status::Ok();
}

// An index tensor [B, S_q, *] (4-byte loads).
Status check_index_tensor(const char* kOp, const char* name, const int32_t* ptr, int64_t batch_stride,
                          int64_t seq_stride) {
  SELKV_CHECK_ARG(ptr != nullptr, name, "must not be null");
  SELKV_CHECK_ARG(aligned4(ptr), name, "must be 4-byte aligned");
  SELKV_CHECK_ARG(batch_stride >= 0 && seq_stride >= 0, name, "strides must be >= 0 (last dim contiguous)");
  return Status::Ok();
}

}  // namespace

Status check_sparse_mla_decode(const SparseDecodeParams& p, const DecodeMetadata& md,
                               size_t workspace_bytes) {
  constexpr const char* kOp = "selkv::sparse_mla_decode";
  DecodeShape shape{p.batch, p.seq_q, p.num_heads, p.topk, p.topk_length, 0};
  shape.extra_topk = p.extra_topk;
  shape.extra_topk_length = p.extra_topk_length;
  SELKV_RETURN_IF_ERROR(check_shape(kOp, shape));
  SELKV_RETURN_IF_ERROR(detail::check_sm_scale(kOp, p.sm_scale));
  // cache: ds_mla_fp8 (q and K 576 dims) or model1_fp8 (512)
  const PagedKvCache& c = p.cache;
  SELKV_CHECK_ARG(c.format == KvFormat::kDsMlaFp8 || c.format == KvFormat::kModel1Fp8, "cache",
                  "format must be ds_mla_fp8 or model1_fp8, got ", fmt::format_name(c.format));
  SELKV_RETURN_IF_ERROR(check_cache_view(kOp, "cache", c));
  // The extra cache: model1_fp8 only (FlashMLA has it there; the ds_mla_fp8 kernels are built
  // without it), the main cache's format, its own view.
  if (p.extra_topk == 0) {
    SELKV_CHECK_ARG(p.extra_cache.data == nullptr, "extra_cache", "given (data not null) but extra_topk is 0");
    SELKV_CHECK_ARG(p.extra_indices == nullptr, "extra_indices", "given but extra_topk is 0");
  } else {
    SELKV_CHECK_ARG(c.format == KvFormat::kModel1Fp8, "extra_cache",
                    "an extra KV cache needs format model1_fp8, got cache format ", fmt::format_name(c.format));
    SELKV_CHECK_ARG(p.extra_cache.format == c.format, "extra_cache", "format must be the cache's (",
                    fmt::format_name(c.format), "), got ", fmt::format_name(p.extra_cache.format));
    SELKV_RETURN_IF_ERROR(check_cache_view(kOp, "extra_cache", p.extra_cache));
  }
  SELKV_RETURN_IF_ERROR(check_plan(kOp, p, md, workspace_bytes));
  if (int64_t(p.batch) * p.seq_q == 0) return Status::Ok();
  SELKV_RETURN_IF_ERROR(check_q(kOp, p));
  SELKV_RETURN_IF_ERROR(check_index_tensor(kOp, "indices", p.indices, p.indices_batch_stride, p.indices_seq_stride));
  if (p.extra_topk > 0) {
    SELKV_RETURN_IF_ERROR(check_index_tensor(kOp, "extra_indices", p.extra_indices, p.extra_indices_batch_stride,
                                             p.extra_indices_seq_stride));
    SELKV_CHECK_ARG(aligned4(p.extra_topk_length), "extra_topk_length", "must be 4-byte aligned");
  }
  return check_aux_and_outputs(kOp, p, md);
}

Status sparse_mla_decode(const SparseDecodeParams& p, const DecodeMetadata& md, void* workspace,
                         size_t workspace_bytes, cudaStream_t stream) {
  constexpr const char* kOp = "selkv::sparse_mla_decode";
  SELKV_RETURN_IF_ERROR(check_sparse_mla_decode(p, md, workspace_bytes));
  if (int64_t(p.batch) * p.seq_q == 0) return Status::Ok();  // no rows: nothing to launch
  SELKV_RETURN_IF_ERROR(check_workspace(kOp, p, md, workspace));
  SELKV_RETURN_IF_ERROR(detail::require_sm90(kOp));

  decode::DecodeKernelParams k = common_kernel_params(p, md, workspace);
  k.cache = static_cast<const uint8_t*>(p.cache.data);
  k.num_slots = p.cache.num_slots();
  k.page_size = p.cache.page_size;
  k.page = FastDivmod(uint32_t(p.cache.page_size));
  k.block_stride_bytes = p.cache.block_stride_bytes;
  k.indices = p.indices;
  k.indices_batch_stride = p.indices_batch_stride;
  k.indices_seq_stride = p.indices_seq_stride;
  if (p.extra_topk > 0) {
    const PagedKvCache& x = p.extra_cache;
    k.topk_extra = p.extra_topk;
    k.extra_topk_length = p.extra_topk_length;
    k.extra_indices = p.extra_indices;
    k.extra_indices_batch_stride = p.extra_indices_batch_stride;
    k.extra_indices_seq_stride = p.extra_indices_seq_stride;
    k.extra_cache = static_cast<const uint8_t*>(x.data);
    k.extra_num_slots = x.num_slots();
    k.extra_page_size = x.page_size;
    k.extra_page = FastDivmod(uint32_t(x.page_size));
    k.extra_block_stride_bytes = x.block_stride_bytes;
  }
  return launch_decode(kOp, k, md, /*packed=*/false, p.cache.format, stream);
}

// ---- C6: the same decode over a packed KV buffer (selkv/packed.h) ----------------------------

void set_contiguous_strides(PackedDecodeParams* p) { set_contiguous_qol_strides(p); }

Status check_sparse_mla_decode_packed(const PackedDecodeParams& p, const DecodeMetadata& md,
                                      size_t workspace_bytes) {
  constexpr const char* kOp = "selkv::sparse_mla_decode_packed";
  DecodeShape shape{p.batch, p.seq_q, p.num_heads, p.topk, p.topk_length, 0};
  SELKV_RETURN_IF_ERROR(check_shape(kOp, shape));
  // The kernel numbers entries in int32 (packed.h: B * S_q * K < 2^31).
  SELKV_CHECK_ARG(int64_t(p.batch) * p.seq_q * p.topk < (int64_t(1) << 31), "topk",
                  "batch * seq_q * topk must be < 2^31 entries for a packed KV buffer, got ",
                  int64_t(p.batch) * p.seq_q * p.topk);
  SELKV_RETURN_IF_ERROR(detail::check_sm_scale(kOp, p.sm_scale));
  SELKV_RETURN_IF_ERROR(check_plan(kOp, p, md, workspace_bytes));
  if (int64_t(p.batch) * p.seq_q == 0) return Status::Ok();
  SELKV_RETURN_IF_ERROR(check_q(kOp, p));
  SELKV_CHECK_ARG(p.packed_kv != nullptr, "packed_kv", "must not be null");
  SELKV_CHECK_ARG(aligned16(p.packed_kv), "packed_kv", "must be 16-byte aligned");
  const size_t need = packed_kv_workspace_size(p.batch, p.seq_q, p.topk);
  if (p.packed_kv_bytes < need)
    return Status(StatusCode::kWorkspaceTooSmall,
                  detail::concat(kOp, ": packed_kv: needs ", need, " bytes for (batch ", p.batch, ", seq_q ",
                                 p.seq_q, ", topk ", p.topk, "), got ", p.packed_kv_bytes));
  return check_aux_and_outputs(kOp, p, md);
}

Status sparse_mla_decode_packed(const PackedDecodeParams& p, const DecodeMetadata& md, void* workspace,
                                size_t workspace_bytes, cudaStream_t stream) {
  constexpr const char* kOp = "selkv::sparse_mla_decode_packed";
  SELKV_RETURN_IF_ERROR(check_sparse_mla_decode_packed(p, md, workspace_bytes));
  if (int64_t(p.batch) * p.seq_q == 0) return Status::Ok();  // no rows: nothing to launch
  SELKV_RETURN_IF_ERROR(check_workspace(kOp, p, md, workspace));
  SELKV_RETURN_IF_ERROR(detail::require_sm90(kOp));

  // The buffer as the producer reads it: records of 64-entry tiles (a cache of 64-token pages
  // whose slot e is entry e), and the validity words (one int32 per 32 entries) in place of the
  // indices.
  decode::DecodeKernelParams k = common_kernel_params(p, md, workspace);
  const int64_t entries = int64_t(p.batch) * p.seq_q * p.topk;
  k.cache = static_cast<const uint8_t*>(p.packed_kv);
  k.num_slots = entries;
  k.page_size = decode::kBlockTokens;
  k.page = FastDivmod(uint32_t(decode::kBlockTokens));
  k.block_stride_bytes = int64_t(decode::kBlockTokens) * fmt::kDsMlaRecordBytes;
  k.indices = reinterpret_cast<const int32_t*>(k.cache + packed::packed_validity_offset(int64_t(p.batch) * p.seq_q, p.topk));
  return launch_decode(kOp, k, md, /*packed=*/true, KvFormat::kDsMlaFp8, stream);
}

}  // namespace selkv
