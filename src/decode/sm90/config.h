// Tile sizes, warpgroup roles and shared-memory plan of the SM90 FP8 sparse MLA decode kernel.
// See docs/decode-design.md §2.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/numeric_types.h>

#include "decode/decode_params.h"
#include "selkv/formats.h"

namespace selkv::decode::sm90 {

using namespace cute;
using bf16_t = cutlass::bfloat16_t;

inline constexpr int kBlockM = kHeadsPerCta;   // 64 heads: one wgmma M tile
inline constexpr int kBlockN = kBlockTokens;   // 64 selected tokens per KV block
inline constexpr int kNumKBufs = 2;            // double-buffered dequantized KV

inline constexpr int kDimV = fmt::kVDim;  // 512 in both formats: V = K[:, :512]

// Everything the kernel derives from the head count H (one instantiation set per H): H / 64 head
// groups run as one cluster whose CTAs split each 64-token block's dequant between them.
template <int kNumHeads>
struct DecodeTraits {
  static_assert(kNumHeads % kBlockM == 0, "whole 64-head groups");
  static constexpr int kHeads = kNumHeads;
  static constexpr int kCluster = kNumHeads / kBlockM;  // CTAs per cluster (grid.x)
  static_assert(kCluster == 1 || kCluster == 2, "the producer splits a block between at most 2 CTAs");
  static constexpr int kRoundsPerBlock = 2 / kCluster;  // 32-token rounds a CTA dequantizes per block
  static constexpr int kEmptyArrivals = 8 * kCluster;   // consumer warps of the cluster freeing a K buffer
  // Packed decode (C6): whether the producer prefetches a round's records into L2 (as soon as the
  // round is indexed: three rounds ahead; the native path, two). H = 64 is producer-bound and waits
  // on its loads without it; H = 128 is consumer-bound and runs faster without the prefetch
  // instructions (docs/perf-log.md: packed prefetch).
  static constexpr bool kPackedL2Prefetch = kNumHeads == 64;
};

// Warpgroup roles: WG0 = producer (index math, masking, FP8 -> bf16 dequant into smem),
// WG1 = softmax WG (S for all 64 tokens, online softmax, P, O dims [0, 256) with P in registers),
// WG2 = PV WG (O dims [256, 512) with P from smem). See the consumer section of the kernel.
inline constexpr int kNumThreads = 384;
inline constexpr int kNumConsumerThreads = 256;
// 136 / 208 / 160: the producer's round loop needs more than 128, the softmax WG's block loop fits
// in 208 and the PV WG's in 160 (in one-copy kernels the code both run is at RegisterSplit::kShared);
// 144 / 200 / 160 and 144 / 208 / 152 spill more (docs/perf-log.md: decode register split).
inline constexpr int kProducerRegs = 136;   // setmaxnreg.dec
inline constexpr int kSoftmaxWgRegs = 208;  // setmaxnreg.inc: O (128) + S (32) + P (16) + state
inline constexpr int kPvWgRegs = 160;       // setmaxnreg.dec: O (128) + state
// __launch_bounds__(384, 1) on 64K registers, in the allocation's units of 8: 168. setmaxnreg moves
// registers between the warpgroups of a CTA; their sum stays 3 x this.
inline constexpr int kLaunchRegs = 65536 / kNumThreads / 8 * 8;
// The split of one instantiation (docs/perf-log.md: register split per instantiation, packed lane
// mapping, native lane mapping). ds_mla_fp8 kernels (the producer's pair mapping: two tokens a
// thread, two record addresses when paged): H = 64 with fp16 partials, packed or fixed top-k,
// 152 / 192 / 160 (the producer spilled 16-28 B at 144); paged H = 128, 144 / 200 / 160 (12 B at
// 136 in two of four kernels). model1_fp8 (one token a thread): H = 64 fixed top-k with fp16
// partials 144 / 192 / 168, where at 136 the producer spilled. Every other kernel: the default.
template <int kNumHeads, bool kDynamic, bool kF16Partials, bool kPacked, KvFormat kFormat>
struct RegisterSplit {
  static constexpr bool kPair = kFormat == KvFormat::kDsMlaFp8;
  static constexpr bool kPairH64 = kPair && kNumHeads == 64 && kF16Partials && (kPacked || !kDynamic);
  static constexpr bool kPairH128 = kPair && kNumHeads == 128 && !kPacked;
  static constexpr bool kModel1H64 = !kPair && kNumHeads == 64 && !kDynamic && kF16Partials;
  static constexpr int kProducer = kPairH64 ? 152 : kPairH128 || kModel1H64 ? 144 : kProducerRegs;
  static constexpr int kSoftmaxWg = kPairH64 || kModel1H64 ? 192 : kPairH128 ? 200 : kSoftmaxWgRegs;
  static constexpr int kPvWg = kModel1H64 ? kLaunchRegs : kPvWgRegs;
  static_assert(kProducer + kSoftmaxWg + kPvWg == 3 * kLaunchRegs, "setmaxnreg budget");
  // H = 128 (consumer-bound) and model1_fp8 dynamic H = 64 run one copy of the consumer code for
  // both warpgroups: the second warpgroup's row epilogue finds it in the instruction cache. Other
  // H = 64 kernels (producer-bound) a copy per warpgroup at its own count (consumer.cuh
  // run_consumer_wg; docs/perf-log.md: one consumer copy).
  static constexpr bool kOneConsumerCopy = kNumHeads == 128 || (kFormat == KvFormat::kModel1Fp8 && kDynamic);
  // The one copy's shared code (the row walk, the Q load, the row epilogue): half of what the
  // producer leaves, in the allocation's units.
  static constexpr int kShared = (3 * kLaunchRegs - kProducer) / 2 / 8 * 8;
  static_assert(!kOneConsumerCopy || (kPvWg < kShared && kShared < kSoftmaxWg && kShared > kLaunchRegs),
                "setmaxnreg directions");
};
inline constexpr int kTokensPerConsumer = kBlockN / 2;  // 32: the H = 128 cluster halves of a block
inline constexpr int kDimVPerConsumer = kDimV / 2;      // 256
inline constexpr int kVHalfDimOffset = (kDimVPerConsumer / 64) * 512;  // 2048: dims [256, 512) of a tile

// Named barriers (id 0 is __syncthreads).
enum class NamedBar : uint32_t {
  kPReady = 1, kPFree = 2, kRowSum = 3, kQReady = 4, kStageFree = 5,
};

// The row epilogue's 16-bit staging area (consumer.cuh store_row): the Q tile, free from the
// row-end barrier (kRowSum: every S wgmma of the row has completed) until the next row's Q load
// (after kStageFree). Consumer cw's 64 rows x 256 columns at cw * 32 KB, warp w's 16 rows at + 8 KB
// w; row j of a warp is 512 bytes whose 16-byte chunks are XOR-swizzled by j % 8, so stmatrix (8
// rows, one chunk) and the row-wise reads (one row, 32 chunks) are both conflict-free (checked in
// layout_check.cu).
inline constexpr int kStageRowBytes = kDimVPerConsumer * 2;              // 512
inline constexpr int kStageBytesPerWarp = 16 * kStageRowBytes;           // 8 KB
inline constexpr int kStageBytesPerConsumer = kBlockM * kStageRowBytes;  // 32 KB
SELKV_DEC_HD constexpr int stage_row_offset(int j, int chunk) {  // bytes, in a warp's area
  return j * kStageRowBytes + ((chunk ^ (j & 7)) << 4);
}

// The kernel's geometry for one record format (DecodeLayout<F>, a template parameter of the
// kernel, its warpgroups and their smem): kDimQK = the dequantized K width (576 ds_mla_fp8: 8
// NoPE tiles of 64 + RoPE; 512 model1_fp8: 7 NoPE tiles of 64 + RoPE), the NoPE width, and the
// tile layouts and shared-memory plan derived from them. V = K[:, :512] in both, so the PV side
// does not depend on the format.
//
// All bf16 tiles are K-major with the 128-byte swizzle. K/Q tiles are laid out row-group-major
// (Step<_2,_1>): element (t, d) sits at (t/8)*kKRowGroupStride + (d/64)*512 + (t%8)*64 + d%64
// (pre-swizzle; kKRowGroupStride = (kDimQK/64)*512), so rows [32, 64) are the same layout at
// +kKHalfTokenOffset elements (the H = 128 peer CTA's half of a block) and dims [256, 512) are the
// same layout at +kVHalfDimOffset = 2048 elements (the PV WG's V half). Both offsets are
// multiples of 1024 bytes, the swizzle period, so a plain pointer offset is exact.
using SwAtom = GMMA::Layout_K_SW128_Atom<bf16_t>;  // 8 x 64
using SmemLayoutP = decltype(tile_to_shape(SwAtom{}, Shape<Int<kBlockM>, Int<kBlockN>>{}));

template <int kDimQK_>
struct alignas(1024) SharedStorageOf;

template <KvFormat F>
struct DecodeLayout {
  using Fmt = KvFormatTraits<F>;
  static constexpr KvFormat kFormat = F;
  static constexpr int kDimQK = Fmt::kDequantDim;  // 576 / 512
  static constexpr int kDimNope = Fmt::kNopeDim;   // 512 / 448: RoPE at atom kDimNope / 64
  static_assert(kDimQK % 64 == 0 && kDimNope % 64 == 0 && kDimQK - kDimNope == 64 && kDimQK >= kDimV);
  static constexpr int kKRowGroupStride = (kDimQK / 64) * 512;                       // 4608 / 4096
  static constexpr int kKHalfTokenOffset = (kTokensPerConsumer / 8) * kKRowGroupStride;  // 18432 / 16384
  using SmemLayoutQ = decltype(tile_to_shape(SwAtom{}, Shape<Int<kBlockM>, Int<kDimQK>>{}, Step<_2, _1>{}));
  using SmemLayoutK = decltype(tile_to_shape(SwAtom{}, Shape<Int<kBlockN>, Int<kDimQK>>{}, Step<_2, _1>{}));
  // V half viewed as the (N = dv, K = token) operand of O += P V: MN-major (dv contiguous).
  using SmemLayoutVHalf = decltype(composition(
      SmemLayoutK{}, make_layout(Shape<Int<kDimVPerConsumer>, Int<kBlockN>>{}, Stride<Int<kBlockN>, _1>{})));
  using SharedStorage = SharedStorageOf<kDimQK>;
  static_assert(cosize_v<SmemLayoutK> == kBlockN * kDimQK);
  static_assert(2 * kStageBytesPerConsumer <= kBlockM * kDimQK * 2, "the row epilogue stages in the Q tile");

  // Element offset of (t, d), d % 8 == 0, in a Q/K tile (SmemLayoutK / SmemLayoutQ, base
  // 1024-byte aligned): the 16-byte chunk holding elements [d, d+8) of row t. Checked against
  // CuTe in tests/cpp/test_decode_checks.cpp (layout_check.cu).
  SELKV_DEC_HD static constexpr int k_tile_offset(int t, int d) {
    return (t >> 3) * kKRowGroupStride + (d >> 6) * 512 + (t & 7) * 64 + ((((d >> 3) & 7) ^ (t & 7)) << 3);
  }

  // The producer's 16-byte tile stores (producer.cuh) in the coordinates a lane has (warp w, lane
  // 8 q + l7), split so that the lane's part is loop-invariant; each sum is k_tile_offset of the
  // (token, dims) the lane converts, for every lane (check_tile_layouts, a CPU test).
  // MODEL1: token 32 half + 8 w + l7; NoPE chunk c (0, 1) of atom a = dims 64 a + 16 q + 8 c
  // at half * kKHalfTokenOffset + lane_row_base + 512 a + lane_nope_chunk; RoPE chunk j (q and
  // q + 4) = dims kDimNope + 8 j at half * kKHalfTokenOffset + lane_row_base + lane_rope_chunk.
  SELKV_DEC_HD static constexpr int lane_row_base(int w, int l7) { return w * kKRowGroupStride + l7 * 64; }
  SELKV_DEC_HD static constexpr int lane_nope_chunk(int q, int l7, int c) { return ((2 * q + c) ^ l7) << 3; }
  SELKV_DEC_HD static constexpr int lane_rope_chunk(int j, int l7) { return (kDimNope / 64) * 512 + ((j ^ l7) << 3); }
  // ds_mla_fp8 pair mapping (two tokens a lane): token 32 half + 8 w + row, row = q or q + 4
  // (the half included here); NoPE piece k, chunk c = dims 128 k + 16 l7 + 8 c (the record's bytes
  // 128 k + 16 l7: eight lanes read 128 contiguous bytes) at pair_nope_base + pair_nope_chunk, and
  // RoPE chunk l7 = dims kDimNope + 8 l7 at pair_rope_offset.
  SELKV_DEC_HD static constexpr int pair_nope_base(int half, int w, int row, int l7, int k) {
    return half * kKHalfTokenOffset + w * kKRowGroupStride + row * 64 + (2 * k + (l7 >> 2)) * 512;
  }
  SELKV_DEC_HD static constexpr int pair_nope_chunk(int row, int l7, int c) {
    return ((2 * (l7 & 3) + c) ^ row) << 3;
  }
  SELKV_DEC_HD static constexpr int pair_rope_offset(int half, int w, int row, int l7) {
    return half * kKHalfTokenOffset + w * kKRowGroupStride + row * 64 + (kDimNope / 64) * 512 + ((l7 ^ row) << 3);
  }
};

template <int kDimQK_>
struct alignas(1024) SharedStorageOf {
  alignas(1024) bf16_t q[kBlockM * kDimQK_];             // 72 KB (ds_mla_fp8) / 64 KB (model1_fp8)
  alignas(1024) bf16_t k[kNumKBufs][kBlockN * kDimQK_];  // 2 x 72 KB / 2 x 64 KB
  alignas(1024) bf16_t p[cosize_v<SmemLayoutP>];         // 8 KB
  alignas(16) float row_scale[kBlockM];  // WG1 -> WG2: O rescale factor of the current block
  alignas(16) float row_max[kBlockM];    // WG1 -> WG2 at row end: running max (logit units)
  alignas(16) float row_sum[kBlockM];    // WG1 -> WG2 at row end: softmax denominator
  alignas(16) uint8_t kv_valid_bits[kNumKBufs][kBlockN / 8];  // bit t of the 8 bytes = token t valid
  alignas(8) uint64_t bar_full[kNumKBufs];   // producer -> consumers, 128 arrivals
  alignas(8) uint64_t bar_empty[kNumKBufs];  // consumer warps -> producer(s): 8 (H=64) / 16 (H=128, both CTAs)
  alignas(8) uint64_t bar_remote[kNumKBufs]; // H=128: the peer CTA's half of the tile (st.async tx bytes)
  alignas(8) uint64_t bar_first_loads;       // producer warps -> consumers, once: 4 arrivals (relaxed)
};

// The ds_mla_fp8 geometry under its historical names (layout_check.cu, tests).
using DsMlaLayout = DecodeLayout<KvFormat::kDsMlaFp8>;
using Model1Layout = DecodeLayout<KvFormat::kModel1Fp8>;
using KvFmt = DsMlaLayout::Fmt;
// The ds_mla_fp8 producer reads a record's 4 fp32 scales as one 16-byte load; the model1_fp8 one
// a token's 8 UE8M0 bytes (7 scales + pad) from the page tail as one 8-byte load.
static_assert(KvFmt::kScalesInRecord && KvFmt::kNumTiles == 4 && sizeof(KvFmt::Scale) == 4);
static_assert(!Model1Layout::Fmt::kScalesInRecord && Model1Layout::Fmt::kNumTiles == 7 &&
              Model1Layout::Fmt::kTileElems == 64 && Model1Layout::Fmt::kScaleStride == 8);
inline constexpr int kDimQK = DsMlaLayout::kDimQK;  // 576
inline constexpr int kDimNope = DsMlaLayout::kDimNope;  // 512
inline constexpr int kKRowGroupStride = DsMlaLayout::kKRowGroupStride;    // 4608
inline constexpr int kKHalfTokenOffset = DsMlaLayout::kKHalfTokenOffset;  // 18432
using SmemLayoutQ = DsMlaLayout::SmemLayoutQ;
using SmemLayoutK = DsMlaLayout::SmemLayoutK;
using SmemLayoutVHalf = DsMlaLayout::SmemLayoutVHalf;
using SharedStorage = DsMlaLayout::SharedStorage;
SELKV_DEC_HD constexpr int k_tile_offset(int t, int d) { return DsMlaLayout::k_tile_offset(t, d); }

// Element offset of (m, k) in the P tile (SmemLayoutP, base 1024-byte aligned).
SELKV_DEC_HD constexpr int p_tile_offset(int m, int k) {
  return m * 64 + ((((k >> 3) & 7) ^ (m & 7)) << 3) + (k & 7);
}

using TiledMmaQK = decltype(make_tiled_mma(
    SM90_64x64x16_F32BF16BF16_SS<GMMA::Major::K, GMMA::Major::K>{}, Layout<Shape<_1, _1, _1>>{}));
// WG1: P from registers (RS); WG2: P from the shared P tile (SS).
using TiledMmaPVrs = decltype(make_tiled_mma(
    SM90_64x256x16_F32BF16BF16_RS<GMMA::Major::K, GMMA::Major::MN>{}, Layout<Shape<_1, _1, _1>>{}));
using TiledMmaPV = decltype(make_tiled_mma(
    SM90_64x256x16_F32BF16BF16_SS<GMMA::Major::K, GMMA::Major::MN>{}, Layout<Shape<_1, _1, _1>>{}));

static_assert(sizeof(DsMlaLayout::SharedStorage) <= 227 * 1024, "shared memory plan exceeds 227 KB");
static_assert(sizeof(Model1Layout::SharedStorage) <= 227 * 1024, "shared memory plan exceeds 227 KB");

}  // namespace selkv::decode::sm90
