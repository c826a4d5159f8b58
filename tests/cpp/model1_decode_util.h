// MODEL1 sparse decode test cases, shared by the CPU oracle tests and the GPU tests: random
// model1_fp8 caches whose unwritten slots are NaN-poisoned, index rows with every garbage class
// of DESIGN §2, tails past topk_length pointing at poisoned slots, an optional extra cache.
#pragma once

#include <climits>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "reference/oracle.h"
#include "selkv/formats.h"
#include "test_util.h"

namespace selkv::test {

inline constexpr int kModel1Dim = 512;  // d_qk = d_v

// A host model1_fp8 cache: slots [0, live) written from random bf16 (KV ~ randn * kv_std), every
// other byte 0xff (E4M3 NaN codes, NaN UE8M0 scales): a read of an unwritten slot shows as NaN.
struct Model1Cache {
  int page = 64;
  int64_t num_blocks = 0;
  int64_t stride = 0;  // block stride in bytes (>= page_bytes, may be padded)
  int64_t live = 0;
  std::vector<uint8_t> bytes;

  int64_t num_slots() const { return num_blocks * page; }
  PagedKvCache view() const { return PagedKvCache{bytes.data(), num_blocks, page, stride, KvFormat::kModel1Fp8}; }
  PagedKvCache view_at(const void* data) const { return PagedKvCache{data, num_blocks, page, stride, KvFormat::kModel1Fp8}; }
};

inline Model1Cache make_model1_cache(int page, int64_t num_blocks, int64_t live, std::mt19937_64& rng,
                                     float kv_std = 0.1f, int64_t stride_pad = 0) {
  Model1Cache c;
  c.page = page;
  c.num_blocks = num_blocks;
  c.stride = fmt::page_bytes(KvFormat::kModel1Fp8, page) + stride_pad;
  c.live = live;
  c.bytes.assign(size_t(num_blocks * c.stride), 0xff);
  const PagedKvCache v = c.view();
  const auto latent = randn_bf16(size_t(live) * 448, kv_std, rng);
  const auto rope = randn_bf16(size_t(live) * 64, kv_std, rng);
  for (int64_t s = 0; s < live; ++s)
    ref::encode_slot(latent.data() + s * 448, rope.data() + s * 64, ScaleMode::kPow2, v, c.bytes.data(), s);
  return c;
}

// An index row set [B, S_q, K] over a cache: valid slots in [0, live), every 9th entry garbage
// (-1, -7, INT_MAX, INT_MIN, num_slots), entries at or past lens[b] (when lens is given) pointing
// at poisoned but in-range slots [live, num_slots) or garbage, and row (b, s) = `empty_row` all -1.
inline std::vector<int32_t> make_indices(int B, int S_q, int K, const Model1Cache& c, const std::vector<int32_t>* lens,
                                         int empty_row, std::mt19937_64& rng) {
  std::vector<int32_t> idx(size_t(B) * S_q * K);
  std::uniform_int_distribution<int64_t> live(0, c.live - 1);
  std::uniform_int_distribution<int64_t> dead(c.live, c.num_slots() - 1);
  const int32_t garbage[] = {-1, -7, INT_MAX, INT_MIN, int32_t(c.num_slots())};
  for (int b = 0; b < B; ++b)
    for (int s = 0; s < S_q; ++s)
      for (int k = 0; k < K; ++k) {
        const size_t i = (size_t(b) * S_q + s) * K + k;
        const bool past = lens != nullptr && k >= (*lens)[size_t(b)];
        if (past) {
          idx[i] = c.live < c.num_slots() && k % 3 != 2 ? int32_t(dead(rng)) : garbage[k % 5];
        } else if (i % 9 == 4) {
          idx[i] = garbage[(i / 9) % 5];
        } else {
          idx[i] = int32_t(live(rng));
        }
        if (int(b * S_q + s) == empty_row) idx[i] = -1;
      }
  return idx;
}

// One MODEL1 decode call on host data (K2 = 0: no extra cache).
struct Model1DecodeCase {
  int B = 3, S_q = 2, H = 64, K = 128, K2 = 0;
  bool dyn1 = false, dyn2 = false;
  Model1Cache main, extra;
  std::vector<uint16_t> q;                // [B, S_q, H, 512]
  std::vector<int32_t> idx, idx2;         // [B, S_q, K], [B, S_q, K2]
  std::vector<int32_t> len1, len2;        // [B] when dyn1 / dyn2
  std::vector<float> sink;                // [H] or empty
  float sm_scale = float(std::pow(512.0, -0.55));

  struct Spec {
    int B = 3, S_q = 2, H = 64, K = 128, K2 = 0;
    int page = 61, page2 = 2;
    int64_t blocks = 0, blocks2 = 0;  // 0: enough for the selection and some poisoned slots
    bool dyn1 = false, dyn2 = false, sink = false;
    int empty_row = 1;                // a row whose indices are all -1 in both caches (-1: none)
    int64_t stride_pad = 0;
  };

  Model1DecodeCase(const Spec& sp, std::mt19937_64& rng)
      : B(sp.B), S_q(sp.S_q), H(sp.H), K(sp.K), K2(sp.K2), dyn1(sp.dyn1), dyn2(sp.dyn2) {
    auto blocks_for = [](int64_t want, int page) { return (want + page - 1) / page; };
    const int64_t nb = sp.blocks > 0 ? sp.blocks : blocks_for(2 * int64_t(K) + 40, sp.page);
    main = make_model1_cache(sp.page, nb, nb * sp.page - std::min<int64_t>(20, nb * sp.page / 4), rng, 0.1f, sp.stride_pad);
    q = randn_bf16(size_t(B) * S_q * H * kModel1Dim, 1.f, rng);
    if (dyn1) {
      const int32_t pattern[] = {K, 0, 70, 1, K - 1, 64};
      for (int b = 0; b < B; ++b) len1.push_back(pattern[b % 6]);
    }
    idx = make_indices(B, S_q, K, main, dyn1 ? &len1 : nullptr, sp.empty_row, rng);
    if (K2 > 0) {
      const int64_t nb2 = sp.blocks2 > 0 ? sp.blocks2 : blocks_for(2 * int64_t(K2) + 40, sp.page2);
      extra = make_model1_cache(sp.page2, nb2, nb2 * sp.page2 - std::min<int64_t>(20, nb2 * sp.page2 / 4), rng, 0.1f);
      if (dyn2) {
        const int32_t pattern[] = {0, K2, 33, K2 - 1, 64, 0};
        for (int b = 0; b < B; ++b) len2.push_back(pattern[(b + 1) % 6]);
      }
      idx2 = make_indices(B, S_q, K2, extra, dyn2 ? &len2 : nullptr, sp.empty_row, rng);
    }
    if (sp.sink) {
      std::normal_distribution<float> n(0.f, 1.f);
      for (int h = 0; h < H; ++h) sink.push_back(n(rng));
    }
  }

  size_t out_size() const { return size_t(B) * S_q * H * kModel1Dim; }
  size_t lse_size() const { return size_t(B) * S_q * H; }

  ref::SparseDecodeRefArgs args(std::vector<float>& out, std::vector<float>& lse) const {
    out.assign(out_size(), std::nanf(""));
    lse.assign(lse_size(), std::nanf(""));
    ref::SparseDecodeRefArgs a;
    a.q = q.data();
    a.B = B;
    a.S_q = S_q;
    a.H = H;
    a.cache = main.view();
    a.indices = idx.data();
    a.K = K;
    a.topk_length = dyn1 ? len1.data() : nullptr;
    if (K2 > 0) {
      a.extra_cache = extra.view();
      a.extra_indices = idx2.data();
      a.K2 = K2;
      a.extra_topk_length = dyn2 ? len2.data() : nullptr;
    }
    a.sm_scale = sm_scale;
    a.attn_sink = sink.empty() ? nullptr : sink.data();
    a.out = out.data();
    a.lse = lse.data();
    return a;
  }
};

}  // namespace selkv::test
