// C8 exact simple kernel, tensor-core form for short selections (selkv/qsa.h; qsa_simple.cu picks it
// below kQsaSimpleWarpMinBlocks blocks, qsa_simple_mma.cuh's warp streams above): the body of one CTA per (row, kv head)
// with the scores and the P V products on WMMA tiles (m8n32k16, fp32 accumulation). WMMA is the
// SM70 API: the same source serves V100-class GPUs in fp16 and, from SM80, bf16 too
// (qsa_simple.cuh picks this form or the SIMT one).
//
// The CTA serves the G <= 8 query heads of its kv head (the M of the tiles; rows above G are zero)
// and walks the row's selection 32 columns (a chunk) at a time (chunks without a non-negative token,
// e.g. the -1 padding of a short selection, found by one read of the row and skipped), its 4 warps splitting the head
// dimension: warp w owns dims [w D / 4, (w + 1) D / 4) of K, V and O. Each warp resolves the chunk's
// columns (a lane a column, the validity rule of qsa_select.cuh before any K / V read) and copies its
// K and V slices of every valid token to shared memory (invalid columns get zero rows, nothing
// behind them is read), the next chunk's slices in flight while this one is computed (cp.async from
// SM80), and computes its partial scores Q K^T over its dims; the four partials are summed through shared memory by the warp that owns the head (warp w: heads w
// and w + 4), which takes the head's online-softmax step (lane j owns token j; P rounded to the
// element type, as FlashMLA does) and shares P and the rescale factor; every warp then adds P V to
// its O slice. O stays in accumulator fragments, whose element layout WMMA does not specify, so a
// rescale (some head's running max grew) goes through shared memory (the warp's partial scores, read
// by then; the K slice is being refilled); past a row's first chunks it is rare. A small grid (few
// rows x kv heads for the GPU's SMs) gives the CTA kStreams chunk streams of 4 warps each (stream s takes chunks s, s + kStreams, ...; its own barrier and
// softmax state), merged in stream order at the end; the launcher picks kStreams from the grid and
// the SM count only. The chunks' order within a stream and the merge order are fixed, so the result
// depends only on the selection's column positions and the shape (expanded and compact forms of one
// selection give the same bits).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#include <cstdint>

#include "qsa/qsa_device_util.cuh"
#include "qsa/qsa_kernel_params.h"
#include "qsa/qsa_select.cuh"

namespace selkv::qsa::split_heads {

inline constexpr int kMmaWarps = 4;  // the warps of one chunk stream (they split the head dims)

// Every tile constant, from the head dimension.
template <int D>
struct MmaTile {
  static constexpr int kCols = 32;                    // selection columns a chunk: the N of S
  static constexpr int kHeads = 8;                    // the M: the G heads, zero rows above G
  static constexpr int kDims = D / kMmaWarps;         // head dims a warp owns (64 or 32)
  static constexpr int kLanesPerToken = kDims / 8;    // 16 bytes a lane
  static constexpr int kTokensPerRound = 32 / kLanesPerToken;
  static constexpr int kRounds = kCols / kTokensPerRound;  // loads a lane issues for K, and for V
  static constexpr int kSliceLd = kDims + 8;          // staged row stride (elements): 16-byte rows, 4 banks apart
  static constexpr int kQLd = D + 8;
  static constexpr int kOLd = kDims + 4;              // fp32 O slice staged for a rescale or the epilogue
  static constexpr int kSLd = kCols + 4;
  static constexpr int kPLd = kCols + 8;
  static_assert(kDims % 32 == 0, "D: 128 or 256");
};

// One warp's shared memory. Every WMMA pointer into it is 32-byte aligned (row strides and offsets
// are multiples of 32 bytes where a tile starts).
template <int D>
struct alignas(32) MmaWarpSmem {
  using Tile = MmaTile<D>;
  union {
    uint16_t k[Tile::kCols][Tile::kSliceLd];  // the chunk's K slice
    float o[Tile::kHeads][Tile::kOLd];        // the O slice, staged (K is consumed by then)
  } kbuf;
  uint16_t v[Tile::kCols][Tile::kSliceLd];    // the chunk's V slice
};

// One chunk stream's shared memory.
template <int D>
struct alignas(32) MmaStreamSmem {
  MmaWarpSmem<D> warp[kMmaWarps];
  float s[kMmaWarps][MmaTile<D>::kHeads][MmaTile<D>::kSLd];  // the warps' partial scores
  uint16_t p[MmaTile<D>::kHeads][MmaTile<D>::kPLd];           // the chunk's probabilities, in the element type
  float alpha[MmaTile<D>::kHeads];                             // this chunk's rescale factor of each head
  int32_t rescale[MmaTile<D>::kHeads];                         // whether a head's O rows need it
};

// The live-chunk bitmap: a row's chunks (kQsaSplitMaxChunks of qsa_kernel_params.h) in 32-bit words.
inline constexpr int kLiveWords = (kQsaSplitMaxChunks + 31) / 32;
inline constexpr int32_t kNoChunk = 32 * kLiveWords;  // past every chunk

template <int D, int kStreams>
struct alignas(32) MmaSmem {
  uint16_t q[MmaTile<D>::kHeads][MmaTile<D>::kQLd];
  uint32_t live[kStreams * kMmaWarps][kLiveWords];  // each warp's chunks' bits (chunk k: a non-negative token)
  int32_t first_words[kStreams * kMmaWarps][32];      // expanded: the selection words of chunk w, read by warp w
  MmaStreamSmem<D> stream[kStreams];
  float m[kStreams][MmaTile<D>::kHeads];  // each stream's final max and sum, for the merge
  float l[kStreams][MmaTile<D>::kHeads];
  uint32_t nan[kStreams][kMmaWarps];  // each warp's NaN heads
};
static_assert(sizeof(MmaSmem<256, 1>) <= 48 * 1024, "one stream: static shared memory, at most 48 KiB");

// The barrier of one chunk stream's 4 warps (the whole CTA when it is the only stream).
template <int kStreams>
__device__ __forceinline__ void stream_barrier(int stream) {
  if constexpr (kStreams == 1) {
    __syncthreads();
  } else {
    asm volatile("bar.sync %0, %1;" ::"r"(stream + 1), "r"(kMmaWarps * 32) : "memory");
  }
}

template <typename T, int D, int G, int kStreams>
__device__ __forceinline__ void mma_attend(const QsaSimpleParams& p, MmaSmem<D, kStreams>& sm) {
  namespace wmma = nvcuda::wmma;
  using Tile = MmaTile<D>;
  static_assert(G >= 1 && G <= Tile::kHeads, "G: 1 to 8 heads a kv head");
  using FragA = wmma::fragment<wmma::matrix_a, 8, 32, 16, T, wmma::row_major>;
  using FragKt = wmma::fragment<wmma::matrix_b, 8, 32, 16, T, wmma::col_major>;  // K^T: token n, dim k at n * ld + k
  using FragV = wmma::fragment<wmma::matrix_b, 8, 32, 16, T, wmma::row_major>;
  using FragAcc = wmma::fragment<wmma::accumulator, 8, 32, 16, float>;
  constexpr int kOFrags = Tile::kDims / 32;
  const float kNegInf = -__int_as_float(0x7F800000);

  constexpr int kThreads = kStreams * kMmaWarps * 32;
  const int lane = int(threadIdx.x) % 32, stream = int(threadIdx.x) / 32 / kMmaWarps;
  const int warp = int(threadIdx.x) / 32 % kMmaWarps;  // within the stream: the head dims it owns
  MmaStreamSmem<D>& ss = sm.stream[stream];
  MmaWarpSmem<D>& ws = ss.warp[warp];
  const int64_t cta = blockIdx.x;
  const int32_t r = int32_t(cta / p.num_kv_heads);
  const int32_t kvh = int32_t(cta - int64_t(r) * p.num_kv_heads);
  const RowSel rs = row_sel(p.sel, r);

  // Q of the G heads, zero rows above G; P's rows above G stay zero.
  const T* qrow = static_cast<const T*>(p.io.q) + int64_t(r) * p.io.q_row_stride + int64_t(kvh) * G * p.io.q_head_stride;
  for (int i = int(threadIdx.x); i < Tile::kHeads * D / 8; i += kThreads) {
    const int h = i / (D / 8), c = (i % (D / 8)) * 8;
    uint4 x = make_uint4(0u, 0u, 0u, 0u);
    if (h < G) x = __ldg(reinterpret_cast<const uint4*>(qrow + int64_t(h) * p.io.q_head_stride + c));
    *reinterpret_cast<uint4*>(&sm.q[h][c]) = x;
  }
  for (int i = warp * 32 + lane; i < Tile::kHeads * Tile::kPLd; i += kMmaWarps * 32) (&ss.p[0][0])[i] = 0;
  if (warp == 0 && lane < Tile::kHeads) ss.alpha[lane] = 1.f;  // heads above G keep 1
  // The live-chunk bitmap: the CTA's warps read the row's columns at once (warp w: chunks w, w + W,
  // ... of W warps), so the chunks of an expanded selection without a non-negative token (a short
  // selection's -1 padding) are never walked, each of which would cost the stream a dependent
  // selection load. Those chunks contribute nothing either way: skipping them changes no bit. A
  // compact selection has no padding (rs.cols is the row's own): every chunk is walked.
  {
    constexpr int W = kStreams * kMmaWarps;
    const int cta_warp = int(threadIdx.x) / 32;
    uint32_t bits[kLiveWords] = {};  // chunk w + W i is bit (W i) % 32 + w of word (W i) / 32 (W divides 32)
    if (p.sel.compact) {
#pragma unroll
      for (int i = 0; i < (kQsaSplitMaxChunks + W - 1) / W; ++i)
        bits[(W * i) / 32] |= ((cta_warp + W * i) * Tile::kCols < rs.cols ? 1u : 0u) << ((W * i) % 32 + cta_warp);
    } else {
      // Unconditional loads (a column past the row reads column 0, which every row has), so no
      // branch separates them and they are all in flight at once.
#pragma unroll
      for (int i = 0; i < (kQsaSplitMaxChunks + W - 1) / W; ++i) {
        const int32_t c = (cta_warp + W * i) * Tile::kCols + lane;
        const int32_t t = rs.sel[c < rs.cols ? c : 0];
        bits[(W * i) / 32] |= (c < rs.cols && t >= 0 ? 1u : 0u) << ((W * i) % 32 + cta_warp);
        if (i == 0) sm.first_words[cta_warp][lane] = t;  // the streams' first chunks need no second read
      }
    }
#pragma unroll
    for (int j = 0; j < kLiveWords; ++j) {
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) bits[j] |= __shfl_xor_sync(0xFFFFFFFFu, bits[j], o);
      if (lane == 0) sm.live[cta_warp][j] = bits[j];
    }
  }
  __syncthreads();
  // This stream's live chunks (stream s takes chunks s, s + kStreams, ...).
  constexpr uint32_t kStreamChunks = kStreams == 1 ? 0xFFFFFFFFu : kStreams == 2 ? 0x55555555u : 0x11111111u;
  static_assert(kStreams == 1 || kStreams == 2 || kStreams == 4, "streams: 1, 2 or 4");
  uint32_t live[kLiveWords];
#pragma unroll
  for (int j = 0; j < kLiveWords; ++j) {
    live[j] = 0;
#pragma unroll
    for (int w = 0; w < kStreams * kMmaWarps; ++w) live[j] |= sm.live[w][j];
    live[j] &= kStreamChunks << stream;
  }
  // The first of this stream's live chunks at or after chunk k, or kNoChunk.
  auto next_chunk = [&](int32_t k) -> int32_t { return next_set_bit(live, k); };

  FragAcc o_acc[kOFrags];
#pragma unroll
  for (int n = 0; n < kOFrags; ++n) wmma::fill_fragment(o_acc[n], 0.f);
  // Warp w owns heads w, w + 4: their online softmax (the scores summed over the 4 warps' dims).
  constexpr int kOwn = (G + kMmaWarps - 1) / kMmaWarps;
  float m[kOwn];       // running max (base-2 scores) of an owned head, warp-uniform
  float l_part[kOwn];  // its running sum, this lane's token's share (summed over the warp at the end)
#pragma unroll
  for (int j = 0; j < kOwn; ++j) {
    m[j] = kNegInf;
    l_part[j] = 0.f;
  }
  uint32_t nan_heads = 0;  // bit h: a NaN score reached owned head h (DESIGN §2: the head's out and lse are NaN)
  // This lane's 16 bytes of a token's slice, and the token it takes in each round.
  const int64_t dim_bytes = int64_t(warp * Tile::kDims + (lane % Tile::kLanesPerToken) * 8) * 2;
  const char* kbase = static_cast<const char*>(p.io.k) + int64_t(kvh) * p.io.k_head_stride * 2 + dim_bytes;
  const char* vbase = static_cast<const char*>(p.io.v) + int64_t(kvh) * p.io.v_head_stride * 2 + dim_bytes;
  const int sub = lane / Tile::kLanesPerToken, piece = (lane % Tile::kLanesPerToken) * 8;
  const T* q_smem = reinterpret_cast<const T*>(&sm.q[0][warp * Tile::kDims]);
  const T* k_smem = reinterpret_cast<const T*>(&ws.kbuf.k[0][0]);
  const T* v_smem = reinterpret_cast<const T*>(&ws.v[0][0]);

  // Column `chunk` * 32 + lane resolved in three steps an iteration apart, each using a load the
  // step before issued, so no warp waits on a selection or block-table read: its selection word
  // (load_word), its token's block-table entry (load_entry: the validity rule's checks before the
  // table, then the read of a live token's entry), then validity and the byte offsets of its K and
  // V rows (finish: 0 when invalid).
  struct Entry {
    int32_t token;  // when live
    int32_t page;   // the table entry (-1 when not live or past the table)
    bool live;
  };
  auto load_word = [&](int32_t chunk) -> int32_t {
    const int32_t c = chunk * Tile::kCols + lane;
    if (!p.sel.compact && chunk < kStreams * kMmaWarps) return sm.first_words[chunk][lane];  // (unused when c >= cols)
    return c < rs.cols ? column_word(p.sel, rs, c) : 0;
  };
  auto load_entry = [&](int32_t chunk, int32_t word) -> Entry {
    const int32_t c = chunk * Tile::kCols + lane;
    const int64_t t = c < rs.cols ? word_token(p.sel, rs, c, word) : -1;
    Entry e;
    e.live = token_live(rs, t);
    e.token = int32_t(t);
    e.page = e.live ? table_entry(p.sel, rs, e.token) : -1;
    return e;
  };
  auto finish = [&](const Entry& e, int64_t* koff, int64_t* voff) -> bool {
    const bool valid = e.live && e.page >= 0 && int64_t(e.page) < p.sel.num_pages;
    const int32_t slot = e.token - (e.token / p.sel.page_size) * p.sel.page_size;
    *koff = valid ? (int64_t(e.page) * p.io.k_page_stride + int64_t(slot) * p.io.k_slot_stride) * 2 : 0;
    *voff = valid ? (int64_t(e.page) * p.io.v_page_stride + int64_t(slot) * p.io.v_slot_stride) * 2 : 0;
    return valid;
  };
  // The warp's slice of a chunk's tokens (`off`: the byte offsets its lanes resolved) into `rows`;
  // invalid tokens zero-filled, nothing behind them read.
  auto stage = [&](uint16_t (*rows)[Tile::kSliceLd], const char* base, int64_t off, uint32_t mask) {
#pragma unroll
    for (int i = 0; i < Tile::kRounds; ++i) {
      const int j = i * Tile::kTokensPerRound + sub;
      copy16(&rows[j][piece], base + __shfl_sync(0xFFFFFFFFu, off, j), (mask >> j) & 1u);
    }
  };
  // Two chunks in flight a stream: chunk a (being computed) and b (the stream's next). The K slice
  // of b loads while a's softmax and P V run, the V slice of b while b's scores and softmax run; the
  // copies are warp-private (each warp its own dims), so only the warp waits for them. Copy batches
  // in order K(a), V(a), then per chunk K(b), V(b): "all but the newest one landed" is always the
  // slice needed next.
  // The columns of b's successor c are one step behind b's: c's word loads while b's entry does.
  int32_t chunk_a = next_chunk(0), chunk_b = next_chunk(chunk_a + 1), chunk_c = next_chunk(chunk_b + 1);
  int64_t koff_a, voff_a, koff_b, voff_b;  // chunk a's offsets: the prologue's copies only
  // The prologue's reads all at once: the three chunks' words, then a's and b's entries.
  const int32_t word_a = load_word(chunk_a), word_b = load_word(chunk_b);
  int32_t word_c = load_word(chunk_c);
  const Entry entry_a = load_entry(chunk_a, word_a);
  Entry entry_b = load_entry(chunk_b, word_b);
  bool valid_a = finish(entry_a, &koff_a, &voff_a);
  uint32_t mask_a = __ballot_sync(0xFFFFFFFFu, valid_a);  // the same in every warp of the stream
  if (mask_a != 0u) stage(ws.kbuf.k, kbase, koff_a, mask_a);
  copies_commit();
  if (mask_a != 0u) stage(ws.v, vbase, voff_a, mask_a);
  copies_commit();
  bool valid_b = false;
  while (chunk_a != kNoChunk) {
    FragAcc s_acc;
    if (mask_a != 0u) {  // the warp's partial scores over its dims
      copies_wait<1>();  // K(a)
      __syncwarp();
      wmma::fill_fragment(s_acc, 0.f);
#pragma unroll
      for (int k = 0; k < Tile::kDims / 16; ++k) {
        FragA a;
        FragKt b;
        wmma::load_matrix_sync(a, q_smem + k * 16, Tile::kQLd);
        wmma::load_matrix_sync(b, k_smem + k * 16, Tile::kSliceLd);
        wmma::mma_sync(s_acc, a, b, s_acc);
      }
      __syncwarp();  // every lane has read the K slice before it is refilled
    }
    valid_b = finish(entry_b, &koff_b, &voff_b);
    const uint32_t mask_b = __ballot_sync(0xFFFFFFFFu, valid_b);
    if (mask_b != 0u) stage(ws.kbuf.k, kbase, koff_b, mask_b);
    copies_commit();
    if (mask_a != 0u) {
      wmma::store_matrix_sync(&ss.s[warp][0][0], s_acc, Tile::kSLd, wmma::mem_row_major);
      stream_barrier<kStreams>(stream);  // every warp's partials are in

      // One online-softmax step of each owned head; lane j owns token j.
#pragma unroll
      for (int j = 0; j < kOwn; ++j) {
        const int h = warp + kMmaWarps * j;
        if (h >= G) break;  // warp-uniform
        float dot = ss.s[0][h][lane];
#pragma unroll
        for (int w = 1; w < kMmaWarps; ++w) dot += ss.s[w][h][lane];
        const float s = valid_a ? dot * p.io.scale_log2 : kNegInf;
        if (__any_sync(0xFFFFFFFFu, s != s)) nan_heads |= 1u << h;
        const float m_new = fmaxf(m[j], warp_max(s));
        const float alpha = m[j] == m_new ? 1.f : exp2f(m[j] - m_new);
        const float pr = m_new == kNegInf ? 0.f : exp2f(s - m_new);  // invalid lanes: exp2(-inf) = 0
        l_part[j] = l_part[j] * alpha + pr;
        ss.p[h][lane] = Elem<T>::bits(pr);
        if (lane == 0) {
          ss.alpha[h] = alpha;
          ss.rescale[h] = m[j] != m_new && m[j] != kNegInf;  // a head without tokens so far has zero O rows
        }
        m[j] = m_new;
      }
      stream_barrier<kStreams>(stream);  // P and the factors are in; the partials are read
      bool rescale = false;
#pragma unroll
      for (int h = 0; h < G; ++h) rescale |= ss.rescale[h] != 0;
      if (rescale) {  // warp-uniform; O staged a fragment at a time in the warp's (read) partial scores
#pragma unroll
        for (int n = 0; n < kOFrags; ++n) {
          float* o = &ss.s[warp][0][0];
          wmma::store_matrix_sync(o, o_acc[n], Tile::kSLd, wmma::mem_row_major);
          __syncwarp();
          for (int i = lane; i < Tile::kHeads * Tile::kCols / 4; i += 32) {
            const int h = i / (Tile::kCols / 4), d = (i % (Tile::kCols / 4)) * 4;
            float4* x = reinterpret_cast<float4*>(o + h * Tile::kSLd + d);
            const float f = ss.alpha[h];
            float4 v = *x;
            v.x *= f;
            v.y *= f;
            v.z *= f;
            v.w *= f;
            *x = v;
          }
          __syncwarp();
          wmma::load_matrix_sync(o_acc[n], o, Tile::kSLd, wmma::mem_row_major);
          __syncwarp();  // every lane has read it before the next fragment is staged
        }
      }

      // O += P V over the warp's dims.
      copies_wait<1>();  // V(a)
      __syncwarp();
#pragma unroll
      for (int k = 0; k < Tile::kCols / 16; ++k) {
        FragA pa;
        wmma::load_matrix_sync(pa, reinterpret_cast<const T*>(&ss.p[0][k * 16]), Tile::kPLd);
#pragma unroll
        for (int n = 0; n < kOFrags; ++n) {
          FragV b;
          wmma::load_matrix_sync(b, v_smem + k * 16 * Tile::kSliceLd + n * 32, Tile::kSliceLd);
          wmma::mma_sync(o_acc[n], pa, b, o_acc[n]);
        }
      }
      __syncwarp();  // every lane has read the V slice before it is refilled
    }
    if (mask_b != 0u) stage(ws.v, vbase, voff_b, mask_b);
    copies_commit();
    valid_a = valid_b;
    mask_a = mask_b;
    chunk_a = chunk_b;
    chunk_b = chunk_c;
    chunk_c = next_chunk(chunk_c + 1);
    entry_b = load_entry(chunk_b, word_c);
    word_c = load_word(chunk_c);
  }
  copies_wait<0>();  // nothing lands in the K slice once it stages O
  __syncwarp();

  // ---- epilogue: the streams merged in stream order; out = O / L (0 for an empty head, NaN after
  // a NaN score), lse = ln(sum exp) ----
#pragma unroll
  for (int n = 0; n < kOFrags; ++n) wmma::store_matrix_sync(&ws.kbuf.o[0][n * 32], o_acc[n], Tile::kOLd, wmma::mem_row_major);
#pragma unroll
  for (int j = 0; j < kOwn; ++j) {
    const int h = warp + kMmaWarps * j;
    if (h >= G) break;
    const float l = warp_sum(l_part[j]);
    if (lane == 0) {
      sm.m[stream][h] = m[j];
      sm.l[stream][h] = l;
    }
  }
  if (lane == 0) sm.nan[stream][warp] = nan_heads;
  __syncthreads();
  uint32_t nan_all = 0;
#pragma unroll
  for (int st = 0; st < kStreams; ++st)
#pragma unroll
    for (int w = 0; w < kMmaWarps; ++w) nan_all |= sm.nan[st][w];
  const int64_t head0 = int64_t(kvh) * G;
  T* out_row = static_cast<T*>(p.io.out) + int64_t(r) * p.io.out_row_stride + warp * Tile::kDims;
  // Stream `stream` writes heads stream, stream + kStreams, ... of its warp's dims.
  for (int h = stream; h < G; h += kStreams) {
    float mx = kNegInf;
#pragma unroll
    for (int st = 0; st < kStreams; ++st) mx = fmaxf(mx, sm.m[st][h]);
    const bool nan = (nan_all >> h) & 1u, empty = mx == kNegInf;
    float L = 0.f, wt[kStreams];
#pragma unroll
    for (int st = 0; st < kStreams; ++st) {  // a stream without a token for the head weighs 0
      wt[st] = sm.m[st][h] == kNegInf ? 0.f : exp2f(sm.m[st][h] - mx);
      L += sm.l[st][h] * wt[st];
    }
    const float inv = 1.f / L;
#pragma unroll
    for (int d = 2 * lane; d < Tile::kDims; d += 64) {
      float a = 0.f, b = 0.f;
#pragma unroll
      for (int st = 0; st < kStreams; ++st) {
        if (wt[st] == 0.f) continue;  // its O rows hold only 0 * V (0, or NaN after a NaN V)
        a += sm.stream[st].warp[warp].kbuf.o[h][d] * wt[st];
        b += sm.stream[st].warp[warp].kbuf.o[h][d + 1] * wt[st];
      }
      if (nan) {
        a = b = __int_as_float(0x7FC00000);
      } else if (empty) {
        a = b = 0.f;
      } else {
        a *= inv;
        b *= inv;
      }
      *reinterpret_cast<uint32_t*>(out_row + (head0 + h) * p.io.out_head_stride + d) = Elem<T>::pack(a, b);
    }
    if (p.io.lse != nullptr && warp == 0 && lane == 0) {
      const float lse = nan ? __int_as_float(0x7FC00000) : empty ? kNegInf : mx * 0.69314718055994530942f + logf(L);
      p.io.lse[int64_t(r) * p.io.lse_row_stride + (head0 + h) * p.io.lse_head_stride] = lse;
    }
  }
}

}  // namespace selkv::qsa::split_heads
