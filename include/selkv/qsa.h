// selkv/qsa.h — C8: QSA sparse prefill over selected 4-token blocks of a paged fp16 / bf16 KV
// cache, reading each selected block once per group of rows (DESIGN §3 C8, seed 002). Status: the
// contract, the argument checks, the CPU oracle, the page-4 plan (CPU reference and GPU kernel),
// the exact simple CUDA kernel and the SM90 page-4 kernel exist; qsa_route picks the page-4 kernel
// for R >= 4096 rows selecting K >= 384 blocks with a plan on SM90, the simple kernel otherwise.
//
// Rows. Row r (r < num_rows) is one query token of request req = req_ids[r] at causal position
// p = positions[r]. q [R, Hq, D], out [R, Hq, D], lse [R, Hq] (optional, fp32, natural log).
//
// Selection. Either form, per row (a row selects at most max_blocks = K blocks, K <= 512):
//   - expanded: int32 [R, 4K + 3] logical token positions. The k-th selected block b fills
//     columns 4k..4k+3 with 4b..4b+3, the causal partial block (tokens 4*floor((p+1)/4) .. p,
//     0-3 of them) follows, the rest is -1. Each column is one entry (vLLM's [R, 2051] for K = 512).
//   - compact: int32 block ids [R, K] and counts [R]: entries k < clamp(counts[r], 0, K) select
//     block b = block_ids[r, k], i.e. the 4 entries 4b..4b+3; then the causal partial block of p
//     (the entries 4*floor((p+1)/4) .. p) is added. Ids past the count are never read.
//   The same selection in both forms gives the same result.
//
// Validity (DESIGN §2: invalid entries contribute nothing and are never dereferenced). An entry
// with logical token t is used iff
//   0 <= req < num_req, 0 <= t < seq_lens[req], t / P < block_table_width, and the physical page
//   pg = block_table[req, t / P] is in [0, num_pages);
// it then reads K and V at (pg, t % P, kv_head). Anything else (-1, stale positions past the live
// length, padded rows with a bad request id, block-table entries out of range) is skipped. A row
// and head with no valid entry gives out = 0 exactly and lse = -inf (it is "inert"). Each entry is
// one softmax term (a token listed twice counts twice).
//
// Math. kv_head(h) = h / (Hq / Hkv) (GQA, groups of 1..8 query heads). For each (row, h):
//   s_i = scale * q[r, h] . K[t_i, kv_head(h)],  out = sum_i softmax(s)_i V[t_i, kv_head(h)],
//   lse = log(sum_i exp(s_i)); fp32 accumulation on the GPU (fp64 in the oracle), out rounded to
// the dtype. NaN is never an empty row: a NaN in q or in the K/V of a valid entry makes that
// row / head NaN (out and lse); a NaN anywhere else in the cache is never read.
//
// Caches. k_cache and v_cache are [num_pages, P, Hkv, D] views with strides in elements for
// (page, slot, head) and a contiguous D. Interleaved storage ([pages, 2, P, Hkv, D]) is the same
// struct with v_cache = k_cache + P * Hkv * D and page stride 2 * P * Hkv * D: nothing is copied.
// P is any multiple of 4 (16, 64, 784, ...), so a 4-token block never straddles a page.
//
// Page-4 plan (qsa_plan). The page-4 kernel reads each selected 4-token block (4 consecutive slots
// of one physical page) once for all the rows of a group of consecutive rows that select it.
// qsa_plan lists, for every group of qsa_page4_max_rows(Hq / Hkv) rows (10 at Hq / Hkv = 6), the
// group's distinct valid blocks (physical page, 4-aligned slot; the rows' requests in order of
// first appearance, ascending logical block within one, so each row's causal partial block comes
// after its complete blocks) and for each token a word of the rows that use it; invalid tokens are
// dropped. The layout is in src/qsa/qsa_group_layout.h. A row whose expanded selection is not made
// of 4-token blocks, or that selects a block twice, is marked bad (the simple kernel computes it
// after the page-4 kernel). A plan holds no K/V data.
//
// GPU requirements (checked by the GPU entry points, not by the oracle): q, k_cache, v_cache and
// out 16-byte aligned, with every stride other than D's a multiple of 16 bytes (8 elements);
// int32 arrays and lse 4-byte aligned. out and lse must not share memory with each other or with
// any input. num_rows * Hq < 2^31. A call with num_rows = 0 is a no-op (pointers may be null).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "selkv/status.h"

namespace selkv {

enum class QsaDtype : int32_t { kFp16 = 0, kBf16 = 1 };
enum class QsaSelectionForm : int32_t { kExpanded = 0, kCompact = 1 };

inline constexpr int kQsaMaxBlocks = 512;        // blocks a row selects at most (Qwen's QSA top-k)
inline constexpr int kQsaBlockTokens = 4;        // tokens of one selected block / virtual page
inline constexpr int kQsaMaxGroup = 8;           // Hq / Hkv at most
// Columns of the expanded selection for max_blocks blocks: 4 * max_blocks + 3 (2051 for 512).
inline constexpr int64_t qsa_expanded_cols(int64_t max_blocks) { return 4 * max_blocks + 3; }

// One paged K or V view: element (page, slot, head, d) at
// data[page * page_stride + slot * slot_stride + head * head_stride + d].
struct QsaCacheView {
  const void* data = nullptr;
  int64_t page_stride = 0;  // in elements
  int64_t slot_stride = 0;
  int64_t head_stride = 0;
};

struct QsaSparsePrefillParams {
  QsaDtype dtype = QsaDtype::kFp16;  // of q, the caches and out
  int64_t num_rows = 0;              // R: query tokens
  int32_t num_q_heads = 0;           // Hq
  int32_t num_kv_heads = 0;          // Hkv: Hq % Hkv == 0, Hq / Hkv in [1, 8]
  int32_t head_dim = 0;              // D: 128 or 256

  const void* q = nullptr;           // [R, Hq, D]
  int64_t q_row_stride = 0;          // in elements
  int64_t q_head_stride = 0;

  QsaCacheView k_cache;              // [num_pages, P, Hkv, D]
  QsaCacheView v_cache;              // [num_pages, P, Hkv, D]
  int64_t num_pages = 0;
  int32_t page_size = 0;             // P: a positive multiple of 4

  const int32_t* block_table = nullptr;  // [num_req, block_table_width]: logical page -> physical
  int64_t block_table_stride = 0;        // in elements, between requests
  int32_t num_req = 0;
  int32_t block_table_width = 0;
  const int32_t* seq_lens = nullptr;     // [num_req]: live tokens of each request

  const int32_t* req_ids = nullptr;      // [R]: request of each row (any value; invalid = inert)
  const int32_t* positions = nullptr;    // [R]: causal position of each row

  QsaSelectionForm form = QsaSelectionForm::kExpanded;
  int32_t max_blocks = kQsaMaxBlocks;    // K in [1, 512]
  const int32_t* selection = nullptr;    // expanded: [R, 4K + 3] logical tokens
  int64_t selection_stride = 0;          // in elements, between rows
  const int32_t* block_ids = nullptr;    // compact: [R, K] block ids
  int64_t block_ids_stride = 0;          // in elements, between rows
  const int32_t* block_counts = nullptr; // compact: [R]

  float scale = 0.f;                     // softmax scale (DESIGN §2 sm_scale rule)

  void* out = nullptr;                   // [R, Hq, D]
  int64_t out_row_stride = 0;
  int64_t out_head_stride = 0;
  float* lse = nullptr;                  // [R, Hq] or null
  int64_t lse_row_stride = 0;
  int64_t lse_head_stride = 0;

  // Routing (qsa_route): false lets the launcher pick the page-4 kernel for large row counts and
  // the exact simple kernel otherwise; true always takes the simple kernel.
  bool force_simple = false;
  // The page-4 kernel's plan (qsa_plan of the same selection); unused by the simple kernel and
  // the oracle. Null: the launcher cannot take the page-4 route.
  const void* metadata = nullptr;
  size_t metadata_bytes = 0;
  // Scratch of the page-4 route (qsa_workspace_size(head_dim) bytes, 16-byte aligned, device
  // memory; no initial contents), or null. With it the page-4 kernel gives every SM an equal share
  // of the call's tiles, splitting a group between two SMs where a share ends; without it a CTA
  // takes whole groups (the last wave of groups runs on few SMs). Written by every page-4 call:
  // calls that can run at the same time need distinct workspaces. Unused by the simple kernel.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};

// Argument validation only (no launch), with the GPU's alignment rules; qsa_sparse_prefill runs
// the same checks.
Status check_qsa_sparse_prefill(const QsaSparsePrefillParams& p);

// Runs the checks, then the kernel qsa_route picks, asynchronously on `stream` (no host sync, no
// allocation, graph capturable, deterministic).
Status qsa_sparse_prefill(const QsaSparsePrefillParams& p, cudaStream_t stream);

// The two C8 kernels: the exact simple kernel (one CTA per row and kv head, SM70 and newer) and the
// SM90 page-4 kernel over the plan (a unit, a group of consecutive rows and a kv head, loads each
// selected block once for the rows that selected it; a persistent grid of one CTA an SM, each an
// equal share of the call's tiles when p.workspace is given, a group cut by a share's end merged
// from its pieces; the rows it cannot serve exactly, and the groups whose rows share too few
// blocks for that to pay, which the plan hands over whole, are computed by a fix-up pass of the
// simple kernel). The page-4 route computes the plan's selection: re-plan whenever the selection,
// seq_lens or the block table change.
enum class QsaKernel : int32_t { kSimple = 0, kPage4 = 1 };
// Rows from which a call may take the page-4 kernel.
inline constexpr int64_t kQsaPage4MinRows = 4096;
// Selection width (max_blocks) from which a call may take it: below it a row selects so few
// tokens that the plan and the page-4 kernel's per-group costs exceed what sharing loads across
// rows saves (on the H200 at 4096 rows the simple kernel is faster up to K = 256, the page-4 route
// from K = 384; docs/perf-log.md).
inline constexpr int32_t kQsaPage4MinBlocks = 384;
// Whether p asks for the page-4 route: num_rows >= kQsaPage4MinRows, max_blocks >=
// kQsaPage4MinBlocks, p.metadata given, not p.force_simple, and the environment variable
// SELKV_QSA_PAGE4 is not "0". Host only, reads no device memory.
bool qsa_page4_wanted(const QsaSparsePrefillParams& p);
// The same rule for a call of num_rows rows selecting up to max_blocks blocks that would pass a
// plan and not force_simple: whether it asks for the page-4 route, so whether a plan is worth
// building (qsa_plan runs a kernel; a call that does not ask for the route never reads it). Host
// only, reads no device memory.
bool qsa_page4_wanted(int64_t num_rows, int64_t max_blocks);
// The kernel qsa_sparse_prefill runs for p (valid p): kPage4 when qsa_page4_wanted(p) (on SM90;
// other GPUs take the simple kernel), else kSimple.
QsaKernel qsa_route(const QsaSparsePrefillParams& p);

// Bytes of the page-4 plan of num_rows rows selecting up to max_blocks blocks (0 for invalid
// sizes or zero rows): 4 * (round_up(8 + 4 R + 2 R (K + 1), 4) + 4 R (K + 1)). Layout:
// src/qsa/qsa_group_layout.h.
size_t qsa_metadata_size(int64_t num_rows, int64_t max_blocks);

// Bytes of the page-4 route's workspace (QsaSparsePrefillParams::workspace) for head_dim (128 or
// 256; 0 otherwise): the same on every GPU and for every call of that head dim.
size_t qsa_workspace_size(int64_t head_dim);

// Builds the plan of p's selection into `metadata` (device memory, qsa_metadata_size bytes,
// 16-byte aligned) for p's Hq / Hkv (the grouping depends on it). Reads the selection, req_ids,
// positions, seq_lens and block_table; never the caches, q or out. One CTA per row group on
// `stream`: no host sync, graph capturable; the buffer is byte-identical to the CPU reference
// selkv::ref::qsa_plan's (every word written, unused ones 0).
Status qsa_plan(const QsaSparsePrefillParams& p, void* metadata, size_t metadata_bytes, cudaStream_t stream);

}  // namespace selkv
