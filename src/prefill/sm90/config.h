// Tile sizes, warpgroup roles and shared-memory plan of the SM90 bf16 sparse MLA prefill
// kernel (C7), the v3 block ping-pong. See docs/prefill-design.md §7. Templated on D_qk in
// {576, 512}.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/arch/barrier.h>
#include <cutlass/numeric_types.h>

#include "prefill/prefill_params.h"
#include "sm90/common.cuh"

namespace selkv::prefill::sm90 {

using namespace cute;
using bf16_t = cutlass::bfloat16_t;

// Consumer c (WG1 = A, WG2 = B) owns the even (A) / odd (B) kv block of each pair of 64-row steps:
// it computes S for all 64 heads x 64 rows with m64n64k16 (Q read once per block) and O for its
// d_v half from both blocks: its own P from registers (RS wgmma), the other's P through smem (SS).
// kv tiles are stored 64-column-tile-major (8 KB per 64 x 64 tile) so each slot splits into an
// L half (dims 0-255) and an R half (dims 256-D) with their own full/empty barriers.

inline constexpr int kNumThreads = 384;
inline constexpr int kProducerRegs = 72;   // 128 * 72 + 256 * 216 = 64512 <= 65536
inline constexpr int kConsumerRegs = 216;
inline constexpr int kTileElems = 64 * 64;  // one 64 x 64 SW128 tile
inline constexpr int kTilesL = 4;           // dims [0, 256): V left half

// Named barriers among the 256 consumer threads (0 is __syncthreads).
enum class Bar : uint32_t { kMaxA = 1, kMaxB = 2, kP0 = 3, kP1 = 4, kLSum = 5 };

template <int kD>
struct Config {
  static_assert(kD == 576 || kD == 512, "D_qk must be 576 or 512");
  static constexpr int kTiles = kD / 64;          // 9 or 8
  static constexpr bool kP0InRope = kD == 576;    // P of block 0 overlays slot 0's RoPE tile
  using SwAtom = GMMA::Layout_K_SW128_Atom<bf16_t>;
  using SmemLayoutQK = decltype(tile_to_shape(SwAtom{}, Shape<Int<64>, Int<kD>>{}, Step<_1, _2>{}));
  using SmemLayoutVHalf = decltype(composition(
      tile_to_shape(SwAtom{}, Shape<Int<64>, Int<256>>{}, Step<_1, _2>{}),
      make_layout(Shape<Int<256>, Int<64>>{}, Stride<Int<64>, _1>{})));  // (dv, kv row), MN-major
  using SmemLayoutP = decltype(tile_to_shape(SwAtom{}, Shape<Int<64>, Int<64>>{}));

  using TiledMmaQK = decltype(make_tiled_mma(
      SM90_64x64x16_F32BF16BF16_SS<GMMA::Major::K, GMMA::Major::K>{}, Layout<Shape<_1, _1, _1>>{}));
  using TiledMmaPVrs = decltype(make_tiled_mma(
      SM90_64x256x16_F32BF16BF16_RS<GMMA::Major::K, GMMA::Major::MN>{}, Layout<Shape<_1, _1, _1>>{}));
  using TiledMmaPVss = decltype(make_tiled_mma(
      SM90_64x256x16_F32BF16BF16_SS<GMMA::Major::K, GMMA::Major::MN>{}, Layout<Shape<_1, _1, _1>>{}));

  struct alignas(1024) SharedStorage {
    alignas(1024) bf16_t q[64 * kD];     // 72 / 64 KB; refilled with the next tile's Q after q_empty
    alignas(1024) bf16_t k[2][64 * kD];  // slot 0: even block, slot 1: odd block
    alignas(1024) bf16_t p1[kTileElems];                      // P of the odd block (B -> A)
    alignas(1024) bf16_t p0[kP0InRope ? 64 : kTileElems];     // P of the even block (A -> B), D=512
    alignas(16) float m_x[64];     // running row max handed A -> B -> A
    alignas(16) float l_x[2][2][64];  // [tile parity][consumer] row sums (epilogue)
    alignas(8) uint64_t bar_q;        // Q landed (128 cp.async noinc arrivals)
    alignas(8) uint64_t q_empty;      // both consumers issued and retired their last S of a tile (256)
    alignas(8) uint64_t full[2][2];   // [slot][half], 128 cp.async noinc arrivals
    alignas(8) uint64_t empty[2][2];  // [slot][half], 128 arrivals of the last reader warpgroup
  };
  static_assert(sizeof(SharedStorage) <= 227 * 1024, "shared memory plan exceeds 227 KB");
  __device__ static bf16_t* p0_ptr(SharedStorage& s) {
    if constexpr (kP0InRope) return s.k[0] + 8 * kTileElems;
    else return s.p0;
  }
};

}  // namespace selkv::prefill::sm90
