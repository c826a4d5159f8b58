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
inline constexpr int kDimQK = fmt::kQkDim;     // 576
inline constexpr int kDimV = fmt::kVDim;       // 512
inline constexpr int kDimNope = fmt::kNopeDim; // 512
inline constexpr int kNumKBufs = 2;            // double-buffered dequantized KV

// Warpgroup roles: WG0 = producer (index math, masking, FP8 -> bf16 dequant into smem),
// WG1/WG2 = consumers (consumer c owns tokens [32c, 32c+32) of S and dims [256c, 256c+256) of O).
inline constexpr int kNumThreads = 384;
inline constexpr int kNumConsumerThreads = 256;
inline constexpr int kProducerRegs = 120;  // setmaxnreg.dec (two rounds of records in registers)
inline constexpr int kConsumerRegs = 192;  // setmaxnreg.inc; 128*120 + 256*192 = 384*168 (launch)
inline constexpr int kTokensPerConsumer = kBlockN / 2;  // 32
inline constexpr int kDimVPerConsumer = kDimV / 2;      // 256

// Named barriers (id 0 is __syncthreads).
enum class NamedBar : uint32_t { kMaxExchange = 1, kPReady = 2, kRowSum = 3, kQReady = 4 };

// All bf16 tiles are K-major with the 128-byte swizzle. K/Q tiles are laid out row-group-major
// (Step<_2,_1>): element (t, d) sits at (t/8)*4608 + (d/64)*512 + (t%8)*64 + d%64 (pre-swizzle),
// so rows [32, 64) are the same layout at +18432 elements (the second consumer's tokens) and
// dims [256, 512) are the same layout at +2048 elements (the second consumer's V half). Both
// offsets are multiples of 1024 bytes, the swizzle period, so a plain pointer offset is exact.
using SwAtom = GMMA::Layout_K_SW128_Atom<bf16_t>;  // 8 x 64
using SmemLayoutQ = decltype(tile_to_shape(SwAtom{}, Shape<Int<kBlockM>, Int<kDimQK>>{}, Step<_2, _1>{}));
using SmemLayoutK = decltype(tile_to_shape(SwAtom{}, Shape<Int<kBlockN>, Int<kDimQK>>{}, Step<_2, _1>{}));
using SmemLayoutKHalf =
    decltype(tile_to_shape(SwAtom{}, Shape<Int<kTokensPerConsumer>, Int<kDimQK>>{}, Step<_2, _1>{}));
// V half viewed as the (N = dv, K = token) operand of O += P V: MN-major (dv contiguous).
using SmemLayoutVHalf = decltype(composition(
    SmemLayoutK{}, make_layout(Shape<Int<kDimVPerConsumer>, Int<kBlockN>>{}, Stride<Int<kBlockN>, _1>{})));
using SmemLayoutP = decltype(tile_to_shape(SwAtom{}, Shape<Int<kBlockM>, Int<kBlockN>>{}));

// Element offset of (t, d), d % 8 == 0, in a Q/K tile (SmemLayoutK / SmemLayoutQ, base 1024-byte
// aligned): the 16-byte chunk holding elements [d, d+8) of row t. Checked against CuTe in
// tests/cpp/test_decode_checks.cpp. k_tile_offset(t + 8, d) == k_tile_offset(t, d) + kKRowGroupStride.
inline constexpr int kKRowGroupStride = (kDimQK / 64) * 512;  // 4608
SELKV_DEC_HD constexpr int k_tile_offset(int t, int d) {
  return (t >> 3) * kKRowGroupStride + (d >> 6) * 512 + (t & 7) * 64 + ((((d >> 3) & 7) ^ (t & 7)) << 3);
}

// Element offset of (m, k) in the P tile (SmemLayoutP, base 1024-byte aligned).
SELKV_DEC_HD constexpr int p_tile_offset(int m, int k) {
  return m * 64 + ((((k >> 3) & 7) ^ (m & 7)) << 3) + (k & 7);
}

inline constexpr int kKHalfTokenOffset = (kTokensPerConsumer / 8) * (kDimQK / 64) * 512;  // 18432
inline constexpr int kVHalfDimOffset = (kDimVPerConsumer / 64) * 512;                    // 2048

using TiledMmaQK = decltype(make_tiled_mma(
    SM90_64x32x16_F32BF16BF16_SS<GMMA::Major::K, GMMA::Major::K>{}, Layout<Shape<_1, _1, _1>>{}));
using TiledMmaPV = decltype(make_tiled_mma(
    SM90_64x256x16_F32BF16BF16_SS<GMMA::Major::K, GMMA::Major::MN>{}, Layout<Shape<_1, _1, _1>>{}));

struct alignas(1024) SharedStorage {
  alignas(1024) bf16_t q[cosize_v<SmemLayoutQ>];             // 72 KB
  alignas(1024) bf16_t k[kNumKBufs][cosize_v<SmemLayoutK>];  // 2 x 72 KB
  alignas(1024) bf16_t p[cosize_v<SmemLayoutP>];             // 8 KB
  alignas(16) float row_max[2][2][kBlockM];  // [iteration parity][consumer][row]
  alignas(16) float row_sum[2][kBlockM];     // [consumer][row]
  alignas(16) uint8_t kv_valid[kNumKBufs][kBlockN];
  alignas(8) uint64_t bar_full[kNumKBufs];   // producer -> consumers, 128 arrivals
  alignas(8) uint64_t bar_empty[kNumKBufs];  // consumer warps -> producer(s): 8 (H=64) / 16 (H=128, both CTAs)
  alignas(8) uint64_t bar_remote[kNumKBufs]; // H=128: the peer CTA's half of the tile (st.async tx bytes)
};
static_assert(sizeof(SharedStorage) <= 227 * 1024, "shared memory plan exceeds 227 KB");
static_assert(cosize_v<SmemLayoutK> == kBlockN * kDimQK);

}  // namespace selkv::decode::sm90
