// A small C8 QSA problem on the host for the CPU tests (test_qsa_checks.cpp, test_oracle_qsa.cpp):
// fp16 / bf16 q, a paged K/V cache (separate or interleaved), block table, selection in either
// form, out and lse, with a QsaSparsePrefillParams over them.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "formats/codec.h"
#include "selkv/qsa.h"

namespace qsa_test {

using namespace selkv;

struct Problem {
  // Shape (set before build()).
  QsaDtype dtype = QsaDtype::kFp16;
  int64_t R = 2;
  int Hq = 2, Hkv = 1, D = 128;
  int64_t pages = 4;
  int P = 16;
  int num_req = 1, width = 4;
  int K = 4;  // max_blocks
  bool interleaved = false;
  QsaSelectionForm form = QsaSelectionForm::kExpanded;

  std::vector<uint16_t> q, kv, k, v, out;  // kv: interleaved [pages, 2, P, Hkv, D]
  std::vector<float> lse;
  std::vector<int32_t> table, lens, req, pos, sel, ids, counts;
  QsaSparsePrefillParams p;

  int64_t cols() const { return form == QsaSelectionForm::kCompact ? K : qsa_expanded_cols(K); }
  uint16_t h(float f) const {
    return dtype == QsaDtype::kBf16 ? codec::float_to_bf16(f) : codec::float_to_f16(f);
  }
  float f(uint16_t x) const { return dtype == QsaDtype::kBf16 ? codec::bf16_to_float(x) : codec::f16_to_float(x); }

  // Allocates everything (zeros; selection -1, counts 0, identity block table, lens 0) and points p at it.
  void build() {
    q.assign(size_t(R * Hq * D), 0);
    const size_t cache = size_t(pages * P * Hkv * D);
    if (interleaved) {
      kv.assign(2 * cache, 0);
    } else {
      k.assign(cache, 0);
      v.assign(cache, 0);
    }
    out.assign(size_t(R * Hq * D), 0x7777);
    lse.assign(size_t(R * Hq), 12345.f);
    table.assign(size_t(num_req * width), 0);
    for (int i = 0; i < num_req * width; ++i) table[size_t(i)] = int32_t(i % pages);
    lens.assign(size_t(num_req), 0);
    req.assign(size_t(R), 0);
    pos.assign(size_t(R), 0);
    sel.assign(size_t(R * qsa_expanded_cols(K)), -1);
    ids.assign(size_t(R * K), -1);
    counts.assign(size_t(R), 0);
    repoint();
  }

  void repoint() {
    p = QsaSparsePrefillParams{};
    p.dtype = dtype;
    p.num_rows = R;
    p.num_q_heads = Hq;
    p.num_kv_heads = Hkv;
    p.head_dim = D;
    p.q = q.data();
    p.q_row_stride = int64_t(Hq) * D;
    p.q_head_stride = D;
    const int64_t slot = int64_t(Hkv) * D;
    if (interleaved) {
      p.k_cache = {kv.data(), 2 * P * slot, slot, D};
      p.v_cache = {kv.data() + P * slot, 2 * P * slot, slot, D};
    } else {
      p.k_cache = {k.data(), P * slot, slot, D};
      p.v_cache = {v.data(), P * slot, slot, D};
    }
    p.num_pages = pages;
    p.page_size = P;
    p.block_table = table.data();
    p.block_table_stride = width;
    p.num_req = num_req;
    p.block_table_width = width;
    p.seq_lens = lens.data();
    p.req_ids = req.data();
    p.positions = pos.data();
    p.form = form;
    p.max_blocks = K;
    p.selection = sel.data();
    p.selection_stride = qsa_expanded_cols(K);
    p.block_ids = ids.data();
    p.block_ids_stride = K;
    p.block_counts = counts.data();
    p.scale = 0.0625f;
    p.out = out.data();
    p.out_row_stride = int64_t(Hq) * D;
    p.out_head_stride = D;
    p.lse = lse.data();
    p.lse_row_stride = Hq;
    p.lse_head_stride = 1;
  }

  // Element offsets of K / V of (page, slot, kv head).
  uint16_t* kptr(int64_t page, int64_t slot, int head) {
    uint16_t* base = interleaved ? kv.data() : k.data();
    return base + page * p.k_cache.page_stride + slot * p.k_cache.slot_stride + head * p.k_cache.head_stride;
  }
  uint16_t* vptr(int64_t page, int64_t slot, int head) {
    uint16_t* base = interleaved ? kv.data() + P * int64_t(Hkv) * D : v.data();
    return base + page * p.v_cache.page_stride + slot * p.v_cache.slot_stride + head * p.v_cache.head_stride;
  }

  // Row r selects blocks `blocks` (both forms are written) at position `position` of request rq.
  void select(int64_t r, int rq, int32_t position, const std::vector<int32_t>& blocks) {
    req[size_t(r)] = rq;
    pos[size_t(r)] = position;
    int32_t* s = sel.data() + r * qsa_expanded_cols(K);
    int c = 0;
    for (int32_t b : blocks)
      for (int i = 0; i < 4; ++i) s[c++] = 4 * b + i;
    for (int64_t t = 4 * ((int64_t(position) + 1) / 4); t <= position; ++t) s[c++] = int32_t(t);
    for (size_t i = 0; i < blocks.size(); ++i) ids[size_t(r * K) + i] = blocks[i];
    counts[size_t(r)] = int32_t(blocks.size());
  }

  void fill_random(std::mt19937_64& rng, float kv_scale = 1.f) {
    std::normal_distribution<float> n(0.f, 1.f);
    for (auto& x : q) x = h(n(rng));
    // By (page, slot, head): the same values whatever the layout (separate or interleaved).
    for (int64_t pg = 0; pg < pages; ++pg)
      for (int64_t s = 0; s < P; ++s)
        for (int hd = 0; hd < Hkv; ++hd) {
          uint16_t* kk = kptr(pg, s, hd);
          uint16_t* vv = vptr(pg, s, hd);
          for (int d = 0; d < D; ++d) kk[d] = h(n(rng) * kv_scale);
          for (int d = 0; d < D; ++d) vv[d] = h(n(rng) * kv_scale);
        }
  }
};

}  // namespace qsa_test
