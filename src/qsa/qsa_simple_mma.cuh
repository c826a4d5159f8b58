// C8 exact simple kernel, tensor-core form (selkv/qsa.h): the body of one CTA per (row, kv head)
// with the scores and the P V products on tensor cores (fp32 accumulation): from SM80 mma.sync
// m16n8k16 on rows read by ldmatrix, below (V100-class GPUs, fp16) WMMA tiles. qsa_simple.cu picks
// W (2, 4 or 12 warps) from the selection's width and the grid.
//
// Every warp of the CTA is a chunk stream of its own: it walks the row's selection 16 columns (a
// chunk) at a time, taking chunks w, w + W, ... of the CTA's W warps, with the whole head dimension
// and its own online softmax over the G <= 8 query heads of the kv head, so no barrier stands in the
// loop and nothing is computed twice. Chunks without a non-negative token (the -1 padding of a short
// selection) are found by one read of the row and never walked. A chunk: lanes 0-15 resolve its
// columns (the validity rule of qsa_select.cuh before any K / V read), the warp copies the valid
// tokens' K and V rows to shared memory (invalid ones zero-filled, nothing behind them read), the
// next chunk's in flight while this one is computed; the softmax step (lanes 4h .. 4h + 3 own head
// h, 4 tokens each; P rounded to the element type, as FlashMLA does).
//  - From SM80: 16-byte cp.async copies into rows of exactly D elements whose 16-byte units are
//    swizzled by the row (qsa_warp_mma.cuh): a row starting on a 128-byte boundary keeps each global
//    line one L2 request (rows padded for conflict-free reads split a line's request in two or
//    three, and the L2's request rate bounds these loads). Q's rows swizzled the same way; S = Q K^T
//    on m16n8k16 (heads in the rows, 8-15 zero); the owned head's scores are its accumulators, and
//    its P is the B operand of O^T += V^T P^T (m16n8k16, dims in the rows), so S, P and O never
//    leave registers until the merge.
//  - Below SM80: plain loads into rows padded by 16 bytes; S on WMMA m16n16k16 tiles through shared
//    memory (Q^T stored column-major), O += P V on m8n32k16 tiles; a head whose running max grew has
//    its O rows rescaled in place through a row map of the fragment's elements, read once from a
//    tile of row numbers (WMMA leaves the element layout unspecified, not variable).
// The W streams are merged in warp order at the end, so the result depends only on the selection's
// column positions, the shape and W (expanded and compact forms of one selection give the same
// bits).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#include <cstdint>

#include "qsa/qsa_device_util.cuh"
#include "qsa/qsa_kernel_params.h"
#include "qsa/qsa_select.cuh"
#include "qsa/qsa_warp_mma.cuh"

namespace selkv::qsa::warp_streams {

// Every tile constant, from the head dimension.
template <int D>
struct MmaTile {
  static constexpr int kCols = kQsaWarpChunkCols;   // a chunk's tokens: the N of S, the K of P V
  static constexpr int kHeads = 8;                    // O's rows: the G heads, zero above G
  static constexpr int kLanesPerToken = D / 8;        // 16 bytes a lane
  static constexpr int kTokensPerRound = 32 / kLanesPerToken;
  static constexpr int kRounds = kCols / kTokensPerRound;  // copies a lane issues for K, and for V
  static constexpr int kSliceLd = D + 8;              // below SM80, staged row stride (elements): 4 banks apart
  static constexpr int kRowBytes = D * 2;             // from SM80, a staged row (swizzled, 128-byte aligned)
  static constexpr int kQtLd = 8;                     // Q^T: the 8 heads of dim k at k * 8
  static constexpr int kSLd = kCols + 4;
  static constexpr int kPLd = kCols + 8;
  static constexpr int kOLd = D + 4;                  // fp32 O staged for the merge
  static constexpr int kOFrags = D / 32;
  static_assert(kCols == 16 && (D == 128 || D == 256), "16-column chunks; D: 128 or 256");
};

// One warp's shared memory. Every WMMA pointer into it is 32-byte aligned (row strides and offsets
// are multiples of 32 bytes where a tile starts); from SM80 the K and V rows start at the buffers'
// 128-byte-aligned bases.
template <int D>
struct alignas(128) MmaWarpSmem {
  using Tile = MmaTile<D>;
  union {
    alignas(128) uint16_t k[Tile::kCols][Tile::kSliceLd];  // the chunk's K rows
    float s[Tile::kCols][Tile::kSLd];                      // below SM80, its scores (rows: heads, 8 used)
    float o[Tile::kHeads][Tile::kOLd];                     // O, staged for the merge
  } kbuf;
  alignas(128) uint16_t v[Tile::kCols][Tile::kSliceLd];  // the chunk's V rows
  uint16_t p[Tile::kHeads][Tile::kPLd];                  // below SM80, its probabilities
};

// The live-chunk bitmap: a row's chunks (kQsaWarpMaxChunks of qsa_kernel_params.h) in 32-bit words.
inline constexpr int kLiveWords = (kQsaWarpMaxChunks + 31) / 32;
inline constexpr int32_t kNoChunk = 32 * kLiveWords;  // past every chunk
inline constexpr int kColGroups = (kQsaWarpMaxChunks + 1) / 2;  // 32-column groups (two chunks each)

template <int D, int W>
struct alignas(128) MmaSmem {
  // Q: from SM80 its 8 rows, swizzled like the K rows; below, Q^T and 8 more elements (the score
  // tile's rows 8-15, heads past 8, read each dim's next 8 elements, the next dim's heads: finite
  // values whose score rows are never used).
  uint16_t qt[D * MmaTile<D>::kQtLd + 16];
  MmaWarpSmem<D> warp[W];
  uint8_t group_live[kColGroups];  // expanded: 32-column group g's two chunks, a non-negative token in them
  int32_t first_words[W][32];  // expanded: the selection words of chunks 2w, 2w + 1, read by warp w
  float m[W][MmaTile<D>::kHeads];  // each warp's final max and sum, for the merge
  float l[W][MmaTile<D>::kHeads];
  uint32_t nan[W];  // each warp's NaN heads
};

template <typename T, int D, int G, int W>
__device__ __forceinline__ void mma_attend(const QsaSimpleParams& p, MmaSmem<D, W>& sm) {
  namespace wmma = nvcuda::wmma;
  using Tile = MmaTile<D>;
  static_assert(G >= 1 && G <= Tile::kHeads, "G: 1 to 8 heads a kv head");
  // From SM80: swizzled rows, ldmatrix and mma.sync (qsa_warp_mma.cuh); below: WMMA.
  constexpr bool kSync = warp_mma::kHas;
  using FragQt = wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::col_major>;  // head m, dim k at k * 8 + m
  using FragKt = wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major>;  // K^T: token n, dim k at n * ld + k
  using FragS = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;
  using FragP = wmma::fragment<wmma::matrix_a, 8, 32, 16, T, wmma::row_major>;
  using FragV = wmma::fragment<wmma::matrix_b, 8, 32, 16, T, wmma::row_major>;
  using FragO = wmma::fragment<wmma::accumulator, 8, 32, 16, float>;
  static_assert(FragO::num_elements <= 10, "the O row map packs 3 bits an element");
  constexpr int kOFrags = Tile::kOFrags;
  constexpr int kKSteps = D / 16;  // mma.sync: 16-dim steps of S, 16-dim tiles of O^T
  const float kNegInf = -__int_as_float(0x7F800000);

  constexpr int kThreads = W * 32;
  const int lane = int(threadIdx.x) % 32, warp = int(threadIdx.x) / 32;
  MmaWarpSmem<D>& ws = sm.warp[warp];
  const int64_t cta = blockIdx.x;
  const int32_t r = int32_t(cta / p.num_kv_heads);
  const int32_t kvh = int32_t(cta - int64_t(r) * p.num_kv_heads);
  if (p.only_nonfinite && !fixup_flagged<T, G>(p, r, kvh)) return;
  const RowSel rs = row_sel(p.sel, r);
  const T* qrow = static_cast<const T*>(p.io.q) + int64_t(r) * p.io.q_row_stride + int64_t(kvh) * G * p.io.q_head_stride;

  // ---- prologue: Q and the live-chunk map, their global reads in flight together, one barrier ----
  // Q's 8 rows (heads, zero above G) in 16-byte units: from SM80 swizzled like the K rows (read by
  // ldmatrix), below as Q^T (column-major, for WMMA). Loaded first, stored after the selection's
  // reads are issued.
  constexpr int kQUnits = Tile::kHeads * D / 8, kQLoads = (kQUnits + kThreads - 1) / kThreads;
  uint4 q_units[kQLoads];
#pragma unroll
  for (int i = 0; i < kQLoads; ++i) {
    const int idx = int(threadIdx.x) + i * kThreads;
    const int h = kSync ? idx / (D / 8) : idx % Tile::kHeads, u = kSync ? idx % (D / 8) : idx / Tile::kHeads;
    q_units[i] = make_uint4(0u, 0u, 0u, 0u);
    if (idx < kQUnits && h < G) q_units[i] = __ldg(reinterpret_cast<const uint4*>(qrow + int64_t(h) * p.io.q_head_stride + u * 8));
  }
  // The live-chunk map: the CTA's warps read the row's columns at once (warp w: 32-column groups
  // w, w + W, ...), so the chunks of an expanded selection without a non-negative token (a short
  // selection's -1 padding) are never walked, each of which would cost its stream a dependent
  // selection load. Those chunks contribute nothing either way: skipping them changes no bit. A
  // compact selection has no padding (rs.cols is the row's own): every chunk is walked.
  // Unconditional loads (a column past the row reads column 0, which every row has), so no branch
  // separates them and they are all in flight at once.
  constexpr int kGroups = (kColGroups + W - 1) / W;
  int32_t t[kGroups];
  if (!p.sel.compact) {
#pragma unroll
    for (int i = 0; i < kGroups; ++i) {
      const int32_t c = (warp + W * i) * 32 + lane;
      t[i] = rs.sel[c < rs.cols ? c : 0];
    }
  }
#pragma unroll
  for (int i = 0; i < kQLoads; ++i) {
    const int idx = int(threadIdx.x) + i * kThreads;
    if (idx >= kQUnits) continue;
    if constexpr (kSync) {
      *reinterpret_cast<uint4*>(reinterpret_cast<char*>(&sm.qt[0]) + warp_mma::swizzled<Tile::kRowBytes>(idx / (D / 8), idx % (D / 8))) =
          q_units[i];
    } else {
      const int h = idx % Tile::kHeads, c = (idx / Tile::kHeads) * 8;
      const uint32_t w[4] = {q_units[i].x, q_units[i].y, q_units[i].z, q_units[i].w};
#pragma unroll
      for (int j = 0; j < 8; ++j) sm.qt[(c + j) * Tile::kQtLd + h] = uint16_t(w[j / 2] >> (16 * (j % 2)));
    }
  }
  if (!kSync && threadIdx.x < 16) sm.qt[D * Tile::kQtLd + threadIdx.x] = 0;
  if (!p.sel.compact) {
    sm.first_words[warp][lane] = t[0];  // the first chunks need no second read
#pragma unroll
    for (int i = 0; i < kGroups; ++i) {  // group g's two chunks: bits 0, 1 of group_live[g]
      const int32_t g = warp + W * i, c = g * 32 + lane;
      const uint32_t b = __ballot_sync(0xFFFFFFFFu, c < rs.cols && t[i] >= 0);
      if (lane == 0 && g < kColGroups) sm.group_live[g] = uint8_t(((b & 0xFFFFu) != 0u ? 1u : 0u) | ((b >> 16) != 0u ? 2u : 0u));
    }
  }
  // WMMA: the row of each element of an O fragment (3 bits each): a tile of row numbers, loaded as one.
  uint32_t o_rows = 0;
  if constexpr (!kSync) {
    float* rows = &ws.kbuf.s[0][0];
    for (int i = lane; i < Tile::kHeads * 32; i += 32) rows[i] = float(i / 32);
    __syncwarp();
    FragO f;
    wmma::load_matrix_sync(f, rows, 32, wmma::mem_row_major);
#pragma unroll
    for (int i = 0; i < FragO::num_elements; ++i) o_rows |= uint32_t(f.x[i]) << (3 * i);
    __syncwarp();
  }
  __syncthreads();
  // This warp's live chunks (warp w takes chunks w, w + W, ...).
  uint32_t live[kLiveWords];
#pragma unroll
  for (int j = 0; j < kLiveWords; ++j) {
    const int32_t chunk = 32 * j + lane;
    bool on;
    if (p.sel.compact) {
      on = chunk < (rs.cols + Tile::kCols - 1) / Tile::kCols;
    } else {
      on = chunk / 2 < kColGroups && ((sm.group_live[chunk / 2] >> (chunk % 2)) & 1u) != 0u;
    }
    live[j] = __ballot_sync(0xFFFFFFFFu, on && chunk % W == warp);
  }
  // The first of this warp's live chunks at or after chunk k, or kNoChunk.
  auto next_chunk = [&](int32_t k) -> int32_t { return next_set_bit(live, k); };

  FragO o_acc[kSync ? 1 : kOFrags];  // WMMA: O (heads x dims)
  float o_t[kSync ? kKSteps : 1][4];  // mma.sync: O^T tile k, dims 16 k + lane / 4 (+ 8) x heads 2 (lane % 4) (+ 1)
  if constexpr (kSync) {
#pragma unroll
    for (int k = 0; k < kKSteps; ++k) o_t[k][0] = o_t[k][1] = o_t[k][2] = o_t[k][3] = 0.f;
  } else {
#pragma unroll
    for (int n = 0; n < kOFrags; ++n) wmma::fill_fragment(o_acc[n], 0.f);
  }
  // Lanes 4h .. 4h + 3 own head h's softmax, 4 tokens each (mma.sync: the S accumulators' columns
  // 2 (lane % 4) + {0, 1, 8, 9}; WMMA: 4 (lane % 4) + {0 .. 3}); m is the same in the four lanes, l
  // their shares.
  const int own_head = lane / 4;
  int own_tok[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) own_tok[i] = kSync ? (lane % 4) * 2 + (i % 2) + 8 * (i / 2) : (lane % 4) * 4 + i;
  float m_run = kNegInf, l_run = 0.f;
  bool nan_seen = false;  // a NaN score reached the owned head (DESIGN §2: its out and lse are NaN)
  // This lane's 16-byte unit of a token's row, and the token it takes in each round.
  const int sub = lane / Tile::kLanesPerToken, unit = lane % Tile::kLanesPerToken;
  // ldmatrix: lane l addresses row 8 (l / 16) + l % 8 of the chunk at unit 2 k + (l / 8) % 2.
  const int mat_row = (lane / 16) * 8 + lane % 8, mat_unit = (lane / 8) % 2;
  const char* krow = static_cast<const char*>(p.io.k) + int64_t(kvh) * p.io.k_head_stride * 2;  // + a row's offset
  const char* vrow = static_cast<const char*>(p.io.v) + int64_t(kvh) * p.io.v_head_stride * 2;
  const T* qt_smem = reinterpret_cast<const T*>(&sm.qt[0]);
  const T* k_smem = reinterpret_cast<const T*>(&ws.kbuf.k[0][0]);
  const T* v_smem = reinterpret_cast<const T*>(&ws.v[0][0]);
  const T* p_smem = reinterpret_cast<const T*>(&ws.p[0][0]);
  const uint32_t q_rows_addr = sm90::smem_addr(&sm.qt[0]);
  const uint32_t k_rows_addr = sm90::smem_addr(&ws.kbuf.k[0][0]);
  const uint32_t v_rows_addr = sm90::smem_addr(&ws.v[0][0]);

  // Column `chunk` * 16 + lane % 16 resolved in three steps an iteration apart, each using a load
  // issued an iteration earlier, so no warp waits on a selection or block-table read: its selection
  // word (load_word, three chunks ahead), its token's block-table entry (load_entry, two ahead: the
  // validity rule's checks before the table, then the read of a live token's entry), then validity
  // (finish, the next chunk; its rows' offsets are computed where they are staged). Lanes 16-31
  // repeat lanes 0-15 (same addresses).
  const int col = lane % Tile::kCols;
  struct Entry {
    int32_t slot;  // the live token's slot in its page
    int32_t page;  // the table entry (-1 when not live or past the table)
  };
  auto load_word = [&](int32_t chunk) -> int32_t {
    const int32_t c = chunk * Tile::kCols + col;
    if (!p.sel.compact && chunk < 2 * W) return sm.first_words[chunk / 2][(chunk % 2) * Tile::kCols + col];  // (unused when c >= cols)
    return c < rs.cols ? column_word(p.sel, rs, c) : 0;
  };
  auto load_entry = [&](int32_t chunk, int32_t word) -> Entry {
    const int32_t c = chunk * Tile::kCols + col;
    const int64_t t = c < rs.cols ? word_token(p.sel, rs, c, word) : -1;
    Entry e;
    if (token_live(rs, t)) {
      const int32_t lp = int32_t(t) / p.sel.page_size;
      e.slot = int32_t(t) - lp * p.sel.page_size;
      e.page = lp < p.sel.block_table_width ? __ldg(rs.table + lp) : -1;
    } else {
      e.slot = 0;
      e.page = -1;
    }
    return e;
  };
  auto finish = [&](const Entry& e) -> bool { return page_in_range(p.sel, e.page); };  // page -1: not live
  // A valid entry's row in a cache view (bytes from the kv head's base).
  auto row_offset = [&](const Entry& e, int64_t page_stride, int64_t slot_stride) -> int64_t {
    return (int64_t(e.page) * page_stride + int64_t(e.slot) * slot_stride) * 2;
  };
  // A chunk's rows (lane j < 16: entry e of row j) from a cache view into `rows`, 16 bytes a lane
  // (cp.async from SM80, landing at copies_wait; plain loads below); invalid tokens zero-filled,
  // nothing behind them read. From SM80 the rows are D elements long and swizzled.
  auto stage = [&](uint16_t (*rows)[Tile::kSliceLd], const char* base, const Entry& e, int64_t page_stride,
                   int64_t slot_stride, uint32_t mask) {
    const int64_t off = row_offset(e, page_stride, slot_stride);
#pragma unroll
    for (int i = 0; i < Tile::kRounds; ++i) {
      const int j = i * Tile::kTokensPerRound + sub;
      void* dst = kSync ? static_cast<void*>(reinterpret_cast<char*>(&rows[0][0]) + warp_mma::swizzled<Tile::kRowBytes>(j, unit))
                        : static_cast<void*>(&rows[j][unit * 8]);
      copy16(dst, base + unit * 16 + __shfl_sync(0xFFFFFFFFu, off, j), (mask >> j) & 1u);
    }
  };
  // Two chunks in flight: chunk a (being computed) and b (the warp's next). K(b) loads while a's
  // softmax and P V run, V(b) while b's scores and softmax run. Copy batches in order K(a), V(a),
  // then per chunk K(b), V(b): "all but the newest one landed" is always the rows needed next.
  // The columns of the chunks after b, c and d, are one and two steps behind b's.
  int32_t chunk_a = next_chunk(0), chunk_b = next_chunk(chunk_a + 1), chunk_c = next_chunk(chunk_b + 1),
          chunk_d = next_chunk(chunk_c + 1);
  // The prologue's reads all at once: the four chunks' words, then a's, b's and c's entries.
  const int32_t word_a = load_word(chunk_a), word_b = load_word(chunk_b), word_c = load_word(chunk_c);
  int32_t word_d = load_word(chunk_d);
  const Entry entry_a = load_entry(chunk_a, word_a);
  Entry entry_b = load_entry(chunk_b, word_b), entry_c = load_entry(chunk_c, word_c);
  uint32_t mask_a = __ballot_sync(0xFFFFFFFFu, finish(entry_a)) & 0xFFFFu;
  if (mask_a != 0u) stage(ws.kbuf.k, krow, entry_a, p.io.k_page_stride, p.io.k_slot_stride, mask_a);
  copies_commit();
  if (mask_a != 0u) stage(ws.v, vrow, entry_a, p.io.v_page_stride, p.io.v_slot_stride, mask_a);
  copies_commit();
  while (chunk_a != kNoChunk) {
    float alpha = 1.f;  // this chunk's rescale factor of the owned head
    uint32_t p_frag[2] = {0u, 0u};  // mma.sync: the owned head's P, the B fragment of O^T += V^T P^T
    if (mask_a != 0u) {
      copies_wait<1>();  // K(a)
      __syncwarp();
      float sc[4];
      if constexpr (kSync) {
        // S (heads x 16 tokens) as two 16x8 tiles; the owned head's row is c0, c1 of each.
        float s0[4] = {0.f, 0.f, 0.f, 0.f}, s1[4] = {0.f, 0.f, 0.f, 0.f};
        uint32_t a[4];  // Q's rows (A's a0, a2) at units 2k, 2k + 1 and the next step's, for k even
#pragma unroll
        for (int k = 0; k < kKSteps; ++k) {
          uint32_t b[4];
          if (k % 2 == 0) warp_mma::ldmatrix_x4(a, q_rows_addr + warp_mma::swizzled<Tile::kRowBytes>(lane % 8, 2 * k + lane / 8));
          warp_mma::ldmatrix_x4(b, k_rows_addr + warp_mma::swizzled<Tile::kRowBytes>(mat_row, 2 * k + mat_unit));
          const uint32_t a0 = a[2 * (k % 2)], a2 = a[2 * (k % 2) + 1];
          warp_mma::mma_16816<T>(s0, a0, 0u, a2, 0u, b[0], b[1]);
          warp_mma::mma_16816<T>(s1, a0, 0u, a2, 0u, b[2], b[3]);
        }
        sc[0] = s0[0];
        sc[1] = s0[1];
        sc[2] = s1[0];
        sc[3] = s1[1];
      } else {
        FragS s_acc;
        wmma::fill_fragment(s_acc, 0.f);
#pragma unroll
        for (int k = 0; k < D / 16; ++k) {
          FragQt a;
          FragKt b;
          wmma::load_matrix_sync(a, qt_smem + k * 16 * Tile::kQtLd, Tile::kQtLd);
          wmma::load_matrix_sync(b, k_smem + k * 16, Tile::kSliceLd);
          wmma::mma_sync(s_acc, a, b, s_acc);
        }
        __syncwarp();  // every lane has read K(a) before the scores take its place
        wmma::store_matrix_sync(&ws.kbuf.s[0][0], s_acc, Tile::kSLd, wmma::mem_row_major);
        __syncwarp();
        const float4 x = *reinterpret_cast<const float4*>(&ws.kbuf.s[own_head][own_tok[0]]);
        sc[0] = x.x;
        sc[1] = x.y;
        sc[2] = x.z;
        sc[3] = x.w;
      }

      // One online-softmax step of the owned head over its 4 tokens, then over the head's 4 lanes.
      float cmax = kNegInf;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const bool used = own_head < G && ((mask_a >> own_tok[i]) & 1u) != 0u;
        sc[i] = used ? sc[i] * p.io.scale_log2 : kNegInf;
        nan_seen |= sc[i] != sc[i];
        cmax = fmaxf(cmax, sc[i]);
      }
      cmax = fmaxf(cmax, __shfl_xor_sync(0xFFFFFFFFu, cmax, 1));
      cmax = fmaxf(cmax, __shfl_xor_sync(0xFFFFFFFFu, cmax, 2));
      const float m_new = fmaxf(m_run, cmax);
      alpha = m_run == m_new ? 1.f : exp2f(m_run - m_new);
      float psum = 0.f;
      uint32_t pb[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float pr = m_new == kNegInf ? 0.f : exp2f(sc[i] - m_new);  // unused tokens: exp2(-inf) = 0
        psum += pr;
        pb[i] = Elem<T>::bits(pr);
      }
      l_run = l_run * alpha + psum;
      m_run = m_new;
      if constexpr (kSync) {
        p_frag[0] = pb[0] | (pb[1] << 16);
        p_frag[1] = pb[2] | (pb[3] << 16);
      } else {
        *reinterpret_cast<uint2*>(&ws.p[own_head][own_tok[0]]) = make_uint2(pb[0] | (pb[1] << 16), pb[2] | (pb[3] << 16));
      }
      __syncwarp();  // K(a) (or the scores) are read before K(b) lands there; P is in
    }
    const uint32_t mask_b = __ballot_sync(0xFFFFFFFFu, finish(entry_b)) & 0xFFFFu;
    if (mask_b != 0u) stage(ws.kbuf.k, krow, entry_b, p.io.k_page_stride, p.io.k_slot_stride, mask_b);
    copies_commit();
    if (mask_a != 0u) {
      const bool rescale = __any_sync(0xFFFFFFFFu, alpha != 1.f);  // some head's max grew: its O rows scale by alpha
      if constexpr (kSync) {
        if (rescale) {
          const float f0 = __shfl_sync(0xFFFFFFFFu, alpha, 8 * (lane % 4));  // head 2 (lane % 4)
          const float f1 = __shfl_sync(0xFFFFFFFFu, alpha, 8 * (lane % 4) + 4);
#pragma unroll
          for (int k = 0; k < kKSteps; ++k) {
            o_t[k][0] *= f0;
            o_t[k][1] *= f1;
            o_t[k][2] *= f0;
            o_t[k][3] *= f1;
          }
        }
        // O^T += V^T P^T, a 16-dim tile at a time (V^T from V's rows by a transposing ldmatrix).
        copies_wait<1>();  // V(a)
        __syncwarp();
#pragma unroll
        for (int k = 0; k < kKSteps; ++k) {
          uint32_t a[4];
          warp_mma::ldmatrix_x4_trans(a, v_rows_addr + warp_mma::swizzled<Tile::kRowBytes>(mat_row, 2 * k + mat_unit));
          warp_mma::mma_16816<T>(o_t[k], a[0], a[1], a[2], a[3], p_frag[0], p_frag[1]);
        }
      } else {
        if (rescale) {
          float f[FragO::num_elements];
#pragma unroll
          for (int i = 0; i < FragO::num_elements; ++i) f[i] = __shfl_sync(0xFFFFFFFFu, alpha, 4 * int((o_rows >> (3 * i)) & 7u));
#pragma unroll
          for (int n = 0; n < kOFrags; ++n)
#pragma unroll
            for (int i = 0; i < FragO::num_elements; ++i) o_acc[n].x[i] *= f[i];
        }
        // O += P V.
        copies_wait<1>();  // V(a)
        __syncwarp();
        FragP pa;
        wmma::load_matrix_sync(pa, p_smem, Tile::kPLd);
#pragma unroll
        for (int n = 0; n < kOFrags; ++n) {
          FragV b;
          wmma::load_matrix_sync(b, v_smem + n * 32, Tile::kSliceLd);
          wmma::mma_sync(o_acc[n], pa, b, o_acc[n]);
        }
      }
      __syncwarp();  // every lane has read V(a) (and P) before they are refilled
    }
    if (mask_b != 0u) stage(ws.v, vrow, entry_b, p.io.v_page_stride, p.io.v_slot_stride, mask_b);
    copies_commit();
    mask_a = mask_b;
    chunk_a = chunk_b;
    chunk_b = chunk_c;
    chunk_c = chunk_d;
    chunk_d = next_chunk(chunk_d + 1);
    entry_b = entry_c;
    entry_c = load_entry(chunk_c, word_d);
    word_d = load_word(chunk_d);
  }
  copies_wait<0>();  // nothing lands in the K rows once they stage O
  __syncwarp();

  // ---- epilogue: the warps merged in warp order; out = O / L (0 for an empty head, NaN after a
  // NaN score), lse = ln(sum exp) ----
  if constexpr (kSync) {
    const int h = (lane % 4) * 2;
#pragma unroll
    for (int k = 0; k < kKSteps; ++k) {
      const int d = 16 * k + lane / 4;
      ws.kbuf.o[h][d] = o_t[k][0];
      ws.kbuf.o[h + 1][d] = o_t[k][1];
      ws.kbuf.o[h][d + 8] = o_t[k][2];
      ws.kbuf.o[h + 1][d + 8] = o_t[k][3];
    }
  } else {
#pragma unroll
    for (int n = 0; n < kOFrags; ++n) wmma::store_matrix_sync(&ws.kbuf.o[0][n * 32], o_acc[n], Tile::kOLd, wmma::mem_row_major);
  }
  const float l_pair = l_run + __shfl_xor_sync(0xFFFFFFFFu, l_run, 1);
  const float l_head = l_pair + __shfl_xor_sync(0xFFFFFFFFu, l_pair, 2);
  const uint32_t nan_lanes = __ballot_sync(0xFFFFFFFFu, nan_seen);
  if (lane % 4 == 0) {
    sm.m[warp][own_head] = m_run;
    sm.l[warp][own_head] = l_head;
  }
  if (lane == 0) {
    uint32_t heads = 0;
#pragma unroll
    for (int h = 0; h < Tile::kHeads; ++h) heads |= ((nan_lanes >> (4 * h)) & 0xFu) != 0u ? 1u << h : 0u;
    sm.nan[warp] = heads;
  }
  __syncthreads();
  uint32_t nan_all = 0;
#pragma unroll
  for (int w = 0; w < W; ++w) nan_all |= sm.nan[w];
  const int64_t head0 = int64_t(kvh) * G;
  T* out_row = static_cast<T*>(p.io.out) + int64_t(r) * p.io.out_row_stride;
  for (int i = int(threadIdx.x); i < G * (D / 2); i += kThreads) {
    const int h = i / (D / 2), d = (i % (D / 2)) * 2;
    float mx = kNegInf;
#pragma unroll
    for (int w = 0; w < W; ++w) mx = fmaxf(mx, sm.m[w][h]);
    const bool nan = (nan_all >> h) & 1u, empty = mx == kNegInf;
    float L = 0.f, a = 0.f, b = 0.f;
#pragma unroll
    for (int w = 0; w < W; ++w) {  // a warp without a token for the head weighs 0
      if (sm.m[w][h] == kNegInf) continue;  // its O rows hold only 0 * V (0, or NaN after a NaN V)
      const float wt = exp2f(sm.m[w][h] - mx);
      L += sm.l[w][h] * wt;
      a += sm.warp[w].kbuf.o[h][d] * wt;
      b += sm.warp[w].kbuf.o[h][d + 1] * wt;
    }
    if (nan) {
      a = b = __int_as_float(0x7FC00000);
    } else if (empty) {
      a = b = 0.f;
    } else {
      const float inv = 1.f / L;
      a *= inv;
      b *= inv;
    }
    *reinterpret_cast<uint32_t*>(out_row + (head0 + h) * p.io.out_head_stride + d) = Elem<T>::pack(a, b);
    if (p.io.lse != nullptr && d == 0) {
      const float lse = nan ? __int_as_float(0x7FC00000) : empty ? kNegInf : mx * 0.69314718055994530942f + logf(L);
      p.io.lse[int64_t(r) * p.io.lse_row_stride + (head0 + h) * p.io.lse_head_stride] = lse;
    }
  }
}

}  // namespace selkv::qsa::warp_streams
