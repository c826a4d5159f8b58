#include <sstream>
#include <string>
#include <vector>

#include "decode/sm90/config.h"
#include "decode/sm90/layout_check.h"

namespace selkv::decode::sm90 {
namespace {

// The producer's store offsets (DecodeLayout's lane_* functions: one token a lane, the model1_fp8
// kernels; pair_* functions: two tokens a lane, the ds_mla_fp8 kernels, paged and packed), for every
// lane of the four producer warps and both CTA halves: each 16-byte chunk a lane writes is
// k_tile_offset of the (token, dims) it converts, and each mapping writes every chunk of the tile
// exactly once. (The one-token mapping is checked in both geometries.)
template <class L>
std::string check_producer_stores() {
  constexpr int kChunks = kBlockN * L::kDimQK / 8;
  std::vector<int> single(kChunks, 0), pair(kChunks, 0);
  std::ostringstream err;
  auto put = [&](std::vector<int>& seen, const char* what, int got, int t, int d) {
    const int want = L::k_tile_offset(t, d);
    if (got != want) {
      err << what << " store of token " << t << " dims " << d << ": offset " << got << ", tile " << want;
      return false;
    }
    ++seen[want / 8];
    return true;
  };
  for (int half = 0; half < 2; ++half)
    for (int w = 0; w < 4; ++w)
      for (int lane = 0; lane < 32; ++lane) {
        const int q = lane >> 3, l7 = lane & 7, hb = half * L::kKHalfTokenOffset;
        const int t = 32 * half + 8 * w + l7;
        for (int a = 0; a < L::kDimNope / 64; ++a)
          for (int c = 0; c < 2; ++c)
            if (!put(single, "one-token NoPE", hb + L::lane_row_base(w, l7) + a * 512 + L::lane_nope_chunk(q, l7, c), t,
                     64 * a + 16 * q + 8 * c))
              return err.str();
        for (int j : {q, q + 4})
          if (!put(single, "one-token RoPE", hb + L::lane_row_base(w, l7) + L::lane_rope_chunk(j, l7), t,
                   L::kDimNope + 8 * j))
            return err.str();
        if constexpr (L::kFormat == KvFormat::kDsMlaFp8) {  // the pair mapping converts ds_mla_fp8 records
          for (int row : {q, q + 4}) {
            const int tp = 32 * half + 8 * w + row;
            for (int k = 0; k < L::kDimNope / 128; ++k)
              for (int c = 0; c < 2; ++c)
                if (!put(pair, "pair NoPE",
                         L::pair_nope_base(half, w, row, l7, k) + L::pair_nope_chunk(row, l7, c), tp,
                         128 * k + 16 * l7 + 8 * c))
                  return err.str();
            if (!put(pair, "pair RoPE", L::pair_rope_offset(half, w, row, l7), tp, L::kDimNope + 8 * l7))
              return err.str();
          }
        }
      }
  auto once = [&](const std::vector<int>& seen, const char* what) -> std::string {
    for (int i = 0; i < kChunks; ++i)
      if (seen[i] != 1)
        return std::string(what) + " stores: tile chunk " + std::to_string(i) + " written " + std::to_string(seen[i]) +
               " times";
    return {};
  };
  std::string e = once(single, "one-token producer");
  if (e.empty() && L::kFormat == KvFormat::kDsMlaFp8) e = once(pair, "pair producer");
  return e;
}

// The offsets of one format's geometry (DecodeLayout<F>).
template <class L>
std::string check_layout() {
  using SmemLayoutK = typename L::SmemLayoutK;
  using SmemLayoutQ = typename L::SmemLayoutQ;
  using SmemLayoutVHalf = typename L::SmemLayoutVHalf;
  constexpr int kDimQK = L::kDimQK, kKHalfTokenOffset = L::kKHalfTokenOffset;
  auto k_tile_offset = [](int t, int d) { return L::k_tile_offset(t, d); };
  // A 1024-byte aligned host buffer stands in for shared memory: CuTe applies the swizzle to
  // address bits, exactly as the hardware does for a 1024-byte aligned smem tile.
  alignas(1024) static bf16_t buf[cosize_v<SmemLayoutK>];
  bf16_t* base = buf;
  std::ostringstream err;
  Tensor sK = make_tensor(make_smem_ptr(base), SmemLayoutK{});
  Tensor sQ = make_tensor(make_smem_ptr(base), SmemLayoutQ{});
  Tensor sP = make_tensor(make_smem_ptr(base), SmemLayoutP{});
  for (int t = 0; t < kBlockN; ++t) {
    for (int d = 0; d < kDimQK; ++d) {
      const long want = long(k_tile_offset(t, d & ~7) + (d & 7));
      const long gotk = long(&sK(t, d) - base), gotq = long(&sQ(t, d) - base);
      if (gotk != want || gotq != want) {
        err << "k_tile_offset(" << t << "," << d << ")=" << want << " but CuTe K " << gotk << " Q " << gotq;
        return err.str();
      }
    }
  }
  // H = 128: each CTA's 32-token half of a K tile is one contiguous run of kKHalfTokenOffset
  // elements (the producer ships it to the peer as one bulk copy), the second at that offset.
  for (int t = 0; t < kTokensPerConsumer; ++t)
    for (int d = 0; d < kDimQK; d += 8)
      if (k_tile_offset(t, d) >= kKHalfTokenOffset ||
          k_tile_offset(t + kTokensPerConsumer, d) != k_tile_offset(t, d) + kKHalfTokenOffset) {
        err << "K half (" << t << "," << d << ") mismatch";
        return err.str();
      }
  for (int cw = 0; cw < 2; ++cw) {
    Tensor sVh = make_tensor(make_smem_ptr(base + cw * kVHalfDimOffset), SmemLayoutVHalf{});
    for (int v = 0; v < kDimVPerConsumer; ++v)
      for (int t = 0; t < kBlockN; ++t)
        if (&sVh(v, t) != &sK(t, v + cw * kDimVPerConsumer)) {
          err << "V half " << cw << " (" << v << "," << t << ") mismatch";
          return err.str();
        }
  }
  for (int m = 0; m < kBlockM; ++m)
    for (int k = 0; k < kBlockN; ++k)
      if (long(&sP(m, k) - base) != long(p_tile_offset(m, k))) {
        err << "p_tile_offset(" << m << "," << k << ") mismatch";
        return err.str();
      }
  return check_producer_stores<L>();
}

}  // namespace

// The epilogue's staging area: a bijection onto each warp's 8 KB, rows contiguous, and both access
// patterns conflict-free (8 rows of one chunk, as stmatrix writes them, in 8 distinct 16-byte bank
// groups; a row's 32 chunks fill 512 contiguous bytes). (That both consumers fit in the Q tile is a
// static_assert of DecodeLayout.)
std::string check_stage_layout() {
  static_assert(4 * kStageBytesPerWarp == kStageBytesPerConsumer);
  std::vector<int> seen(kStageBytesPerWarp / 16, 0);
  for (int j = 0; j < 16; ++j)
    for (int c = 0; c < kStageRowBytes / 16; ++c) {
      const int off = stage_row_offset(j, c);
      if (off % 16 != 0 || off < j * kStageRowBytes || off >= (j + 1) * kStageRowBytes) return "stage row " + std::to_string(j);
      ++seen[off / 16];
    }
  for (int u : seen)
    if (u != 1) return "stage area not a bijection";
  for (int g = 0; g < 16; g += 8)
    for (int c = 0; c < kStageRowBytes / 16; ++c) {
      int groups = 0;
      for (int r = 0; r < 8; ++r) groups |= 1 << ((stage_row_offset(g + r, c) / 16) % 8);
      if (groups != 0xff) return "stmatrix conflict at chunk " + std::to_string(c);
    }
  return {};
}

std::string check_tile_layouts() {
  const std::string st = check_stage_layout();
  if (!st.empty()) return "epilogue staging: " + st;
  const std::string ds = check_layout<DsMlaLayout>();
  if (!ds.empty()) return "ds_mla_fp8: " + ds;
  const std::string m1 = check_layout<Model1Layout>();
  return m1.empty() ? m1 : "model1_fp8: " + m1;
}

}  // namespace selkv::decode::sm90
