// Tile sizes, warpgroup roles and shared-memory plan of the SM90 bf16 sparse MLA prefill
// kernel (C7). See docs/prefill-design.md §2. Templated on D_qk in {576, 512}.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/numeric_types.h>

#include "prefill/prefill_params.h"
#include "sm90/common.cuh"

namespace selkv::prefill::sm90 {

using namespace cute;
using bf16_t = cutlass::bfloat16_t;

inline constexpr int kBlockM = kHeadsPerCta;  // 64 heads
inline constexpr int kBlockN = kBlockTopk;    // 64 kv rows per step
inline constexpr int kDimV = 512;
inline constexpr int kNumKBufs = 2;           // kv ring depth (smem-limited at D_qk = 576)

// WG0 = producer (indices, validity, cp.async gather of Q and kv rows into swizzled smem);
// WG1/WG2 = consumers (consumer c: S for kv rows [32c, 32c+32), O for dv [256c, 256c+256)).
inline constexpr int kNumThreads = 384;
inline constexpr int kNumProducerThreads = 128;
inline constexpr int kNumConsumerThreads = 256;
inline constexpr int kProducerRegs = 96;   // setmaxnreg.dec
inline constexpr int kConsumerRegs = 200;  // setmaxnreg.inc; 128*96 + 256*200 <= 64512 (= 384*168)
inline constexpr int kTokensPerConsumer = kBlockN / 2;  // 32
inline constexpr int kDimVPerConsumer = kDimV / 2;      // 256

enum class NamedBar : uint32_t { kMaxExchange = 1, kPReady = 2, kRowSum = 3 };

template <int kD>
struct Config {
  static_assert(kD == 576 || kD == 512, "D_qk must be 576 or 512");
  static constexpr int kDimQK = kD;
  static constexpr int kChunks = kD / 8;  // 16-byte chunks per row
  using SwAtom = GMMA::Layout_K_SW128_Atom<bf16_t>;  // 8 x 64
  using SmemLayoutQ = decltype(tile_to_shape(SwAtom{}, Shape<Int<kBlockM>, Int<kD>>{}, Step<_2, _1>{}));
  using SmemLayoutK = decltype(tile_to_shape(SwAtom{}, Shape<Int<kBlockN>, Int<kD>>{}, Step<_2, _1>{}));
  using SmemLayoutKHalf =
      decltype(tile_to_shape(SwAtom{}, Shape<Int<kTokensPerConsumer>, Int<kD>>{}, Step<_2, _1>{}));
  // V half as the (N = dv, K = kv row) operand of O += P V: MN-major (dv contiguous).
  using SmemLayoutVHalf = decltype(composition(
      SmemLayoutK{}, make_layout(Shape<Int<kDimVPerConsumer>, Int<kBlockN>>{}, Stride<Int<kBlockN>, _1>{})));
  using SmemLayoutP = decltype(tile_to_shape(SwAtom{}, Shape<Int<kBlockM>, Int<kBlockN>>{}));

  static constexpr int kRowGroupStride = (kD / 64) * 512;
  static constexpr int kKHalfTokenOffset = (kTokensPerConsumer / 8) * kRowGroupStride;
  static constexpr int kVHalfDimOffset = (kDimVPerConsumer / 64) * 512;  // 2048

  using TiledMmaQK = decltype(make_tiled_mma(
      SM90_64x32x16_F32BF16BF16_SS<GMMA::Major::K, GMMA::Major::K>{}, Layout<Shape<_1, _1, _1>>{}));
  using TiledMmaPV = decltype(make_tiled_mma(
      SM90_64x256x16_F32BF16BF16_SS<GMMA::Major::K, GMMA::Major::MN>{}, Layout<Shape<_1, _1, _1>>{}));

  struct alignas(1024) SharedStorage {
    alignas(1024) bf16_t q[cosize_v<SmemLayoutQ>];             // 72 / 64 KB
    alignas(1024) bf16_t k[kNumKBufs][cosize_v<SmemLayoutK>];  // 2 x 72 / 64 KB
    alignas(1024) bf16_t p[cosize_v<SmemLayoutP>];             // 8 KB
    alignas(16) float row_max[2][2][kBlockM];  // [iteration parity][consumer][row]
    alignas(16) float row_sum[2][kBlockM];     // [consumer][row]
    alignas(8) uint64_t bar_q;                 // Q landed (128 cp.async noinc arrivals)
    alignas(8) uint64_t bar_full[kNumKBufs];   // kv tile landed (128 cp.async noinc arrivals)
    alignas(8) uint64_t bar_empty[kNumKBufs];  // consumers done with the tile (256 arrivals)
  };
  static_assert(sizeof(SharedStorage) <= 227 * 1024, "shared memory plan exceeds 227 KB");
  static_assert(cosize_v<SmemLayoutK> == kBlockN * kD);
};

}  // namespace selkv::prefill::sm90
