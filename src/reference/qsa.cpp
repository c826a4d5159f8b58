// Oracle of C8 QSA sparse prefill and of its page-4 group plan (selkv/qsa.h, src/qsa/qsa_group_layout.h)
// on the GPU op's Params with host pointers. Plain loops, fp64 softmax; every entry is resolved
// through the one validity rule of selkv/qsa.h before anything is read.
#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <vector>

#include "common/check.h"
#include "formats/codec.h"
#include "qsa/qsa_checks.h"
#include "qsa/qsa_group_layout.h"
#include "qsa/qsa_kernel_params.h"  // qsa_page4_max_rows: the public plan's grouping
#include "reference/oracle.h"
#include "reference/parallel.h"

namespace selkv::ref {
namespace {

int64_t floor_div4(int64_t x) { return x >= 0 ? x / 4 : -((-x + 3) / 4); }

// What a row's request gives: its live length and block-table row (len 0 when the request is bad).
struct RowCtx {
  int64_t len = 0;
  const int32_t* table = nullptr;
};

RowCtx row_ctx(const QsaSparsePrefillParams& p, int64_t r) {
  RowCtx c;
  const int32_t req = p.req_ids[r];
  if (req < 0 || req >= p.num_req) return c;
  c.len = p.seq_lens[req];
  if (p.block_table_width > 0) c.table = p.block_table + int64_t(req) * p.block_table_stride;
  return c;
}

// The validity rule: token t of the row's request -> (page, slot), or false.
bool resolve(const QsaSparsePrefillParams& p, const RowCtx& c, int64_t t, int32_t* page, int32_t* slot) {
  if (t < 0 || t >= c.len || c.table == nullptr) return false;
  const int64_t lp = t / p.page_size;
  if (lp >= p.block_table_width) return false;
  const int32_t pg = c.table[lp];
  if (pg < 0 || pg >= p.num_pages) return false;
  *page = pg;
  *slot = int32_t(t % p.page_size);
  return true;
}

// Calls fn(tokens, n) for each group of the row's selection, in order: expanded, the 4-column
// groups (the last has 3 columns); compact, the first clamp(count, 0, K) blocks, then the causal
// partial block of the row's position (0-3 tokens).
template <typename Fn>
void for_each_group(const QsaSparsePrefillParams& p, int64_t r, Fn&& fn) {
  int64_t tok[4];
  if (p.form == QsaSelectionForm::kExpanded) {
    const int32_t* row = p.selection + r * p.selection_stride;
    const int64_t cols = qsa_expanded_cols(p.max_blocks);
    for (int64_t c0 = 0; c0 < cols; c0 += 4) {
      const int n = int(std::min<int64_t>(4, cols - c0));
      for (int i = 0; i < n; ++i) tok[i] = row[c0 + i];
      fn(tok, n);
    }
    return;
  }
  const int32_t* ids = p.block_ids + r * p.block_ids_stride;
  const int32_t cnt = std::clamp(p.block_counts[r], 0, p.max_blocks);
  for (int32_t k = 0; k < cnt; ++k) {
    const int64_t b = ids[k];
    for (int i = 0; i < 4; ++i) tok[i] = 4 * b + i;
    fn(tok, 4);
  }
  const int64_t pos = p.positions[r];
  const int64_t base = 4 * floor_div4(pos + 1);
  const int n = int(pos - base + 1);  // 0..3
  for (int i = 0; i < n; ++i) tok[i] = base + i;
  fn(tok, n);
}

// A selection group's valid tokens: their logical block and token mask (0: no valid token);
// irregular when they are not distinct tokens of one block.
struct GroupTokens {
  int64_t block = -1;
  int mask = 0;
  bool irregular = false;
};
GroupTokens group_tokens(const QsaSparsePrefillParams& p, const RowCtx& c, const int64_t* tok, int n) {
  GroupTokens g;
  for (int i = 0; i < n; ++i) {
    int32_t page, slot;
    if (!resolve(p, c, tok[i], &page, &slot)) continue;
    const int64_t b = tok[i] / 4;  // valid tokens are >= 0
    const int bit = 1 << int(tok[i] % 4);
    if (g.mask != 0 && (b != g.block || (g.mask & bit) != 0)) g.irregular = true;  // two blocks, or a repeat
    g.block = b;
    g.mask |= bit;
  }
  return g;
}

float load(const void* base, int64_t idx, QsaDtype d) {
  const uint16_t h = static_cast<const uint16_t*>(base)[idx];
  return d == QsaDtype::kBf16 ? codec::bf16_to_float(h) : codec::f16_to_float(h);
}

void store(void* base, int64_t idx, QsaDtype d, float v) {
  static_cast<uint16_t*>(base)[idx] = d == QsaDtype::kBf16 ? codec::float_to_bf16(v) : codec::float_to_f16(v);
}

}  // namespace

std::vector<QsaEntry> qsa_row_entries(const QsaSparsePrefillParams& p, int64_t r) {
  std::vector<QsaEntry> out;
  const RowCtx c = row_ctx(p, r);
  for_each_group(p, r, [&](const int64_t* tok, int n) {
    for (int i = 0; i < n; ++i) {
      QsaEntry e{tok[i], 0, 0};
      if (resolve(p, c, tok[i], &e.page, &e.slot)) out.push_back(e);
    }
  });
  return out;
}

Status qsa_sparse_prefill(const QsaSparsePrefillParams& p, int threads) {
  qsa::Work work;
  SELKV_RETURN_IF_ERROR(
      qsa::check_params("selkv::qsa_sparse_prefill", p, qsa::Use::kAttention, /*device=*/false, &work));
  if (work == qsa::Work::kNone) return Status::Ok();
  const int64_t Hq = p.num_q_heads, D = p.head_dim, group = p.num_q_heads / p.num_kv_heads;
  detail::parallel_rows(p.num_rows, threads, [&](int64_t r) {
    const std::vector<QsaEntry> ents = qsa_row_entries(p, r);
    std::vector<double> s(ents.size());
    std::vector<double> acc(static_cast<size_t>(D));
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t kvh = h / group;
      const int64_t qoff = r * p.q_row_stride + h * p.q_head_stride;
      const int64_t ooff = r * p.out_row_stride + h * p.out_head_stride;
      float* lse = p.lse != nullptr ? p.lse + r * p.lse_row_stride + h * p.lse_head_stride : nullptr;
      if (ents.empty()) {  // inert row: exact 0 and -inf
        for (int64_t d = 0; d < D; ++d) store(p.out, ooff + d, p.dtype, 0.f);
        if (lse) *lse = -std::numeric_limits<float>::infinity();
        continue;
      }
      double m = -std::numeric_limits<double>::infinity();
      bool nan = false;
      for (size_t i = 0; i < ents.size(); ++i) {
        const int64_t koff = ents[i].page * p.k_cache.page_stride + ents[i].slot * p.k_cache.slot_stride +
                             kvh * p.k_cache.head_stride;
        double dot = 0;
        for (int64_t d = 0; d < D; ++d)
          dot += double(load(p.q, qoff + d, p.dtype)) * double(load(p.k_cache.data, koff + d, p.dtype));
        s[i] = double(p.scale) * dot;
        if (std::isnan(s[i])) nan = true;
        m = std::max(m, s[i]);
      }
      if (nan) {  // NaN is never an empty row
        for (int64_t d = 0; d < D; ++d) store(p.out, ooff + d, p.dtype, std::numeric_limits<float>::quiet_NaN());
        if (lse) *lse = std::numeric_limits<float>::quiet_NaN();
        continue;
      }
      double sum = 0;
      std::fill(acc.begin(), acc.end(), 0.0);
      for (size_t i = 0; i < ents.size(); ++i) {
        const double e = std::exp(s[i] - m);
        sum += e;
        const int64_t voff = ents[i].page * p.v_cache.page_stride + ents[i].slot * p.v_cache.slot_stride +
                             kvh * p.v_cache.head_stride;
        for (int64_t d = 0; d < D; ++d) acc[size_t(d)] += e * double(load(p.v_cache.data, voff + d, p.dtype));
      }
      for (int64_t d = 0; d < D; ++d) store(p.out, ooff + d, p.dtype, float(acc[size_t(d)] / sum));
      if (lse) *lse = float(m + std::log(sum));
    }
  });
  return Status::Ok();
}

Status qsa_plan(const QsaSparsePrefillParams& p, void* metadata, size_t metadata_bytes) {
  qsa::Work work;
  SELKV_RETURN_IF_ERROR(qsa::check_params("selkv::qsa_plan", p, qsa::Use::kPlan, /*device=*/false, &work,
                                          metadata, metadata_bytes));
  if (work == qsa::Work::kNone) return Status::Ok();
  const std::vector<int32_t> w =
      qsa_group_plan(p, qsa::qsa_page4_max_rows(int(p.num_q_heads / p.num_kv_heads)), /*hand_over=*/true);
  std::memcpy(metadata, w.data(), w.size() * sizeof(int32_t));
  return Status::Ok();
}

std::vector<int32_t> qsa_group_plan(const QsaSparsePrefillParams& p, int rows_per_group, bool hand_over) {
  const int64_t R = p.num_rows, K = p.max_blocks, C = qsa::group_capacity(K);
  std::vector<int32_t> w(size_t(qsa::group_plan_words(R, K)), 0);
  if (R <= 0 || rows_per_group < 1 || rows_per_group > qsa::kGroupMaxRows) return w;
  const int64_t groups = (R + rows_per_group - 1) / rows_per_group;
  const int32_t hdr[qsa::kGroupHeaderWords] = {qsa::kGroupMagic, int32_t(R), int32_t(K), rows_per_group,
                                               int32_t(groups), 0, 0, 0};
  std::copy(hdr, hdr + qsa::kGroupHeaderWords, w.begin());
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t row0 = g * rows_per_group;
    const int rows = int(std::min<int64_t>(rows_per_group, R - row0));
    // Per row of the group: logical block -> mask of its tokens the row uses validly.
    std::vector<std::map<int64_t, int>> sel(static_cast<size_t>(rows));
    uint32_t bad = 0;
    for (int j = 0; j < rows; ++j) {
      const int64_t r = row0 + j;
      const RowCtx c = row_ctx(p, r);
      for_each_group(p, r, [&](const int64_t* tok, int n) {
        const GroupTokens g = group_tokens(p, c, tok, n);
        if (g.irregular) bad |= 1u << j;
        if (g.mask == 0) return;
        if (!sel[size_t(j)].emplace(g.block, g.mask).second) bad |= 1u << j;  // the block a second time
      });
    }
    // Valid requests in order of first appearance among the group's rows (whatever those rows
    // hold); within one, ascending logical block.
    std::vector<int32_t> reqs;
    for (int j = 0; j < rows; ++j) {
      const int32_t q = p.req_ids[row0 + j];
      if (q >= 0 && q < p.num_req && std::find(reqs.begin(), reqs.end(), q) == reqs.end()) reqs.push_back(q);
    }
    const int64_t first = row0 * C;
    int64_t count = 0, uses = 0;
    for (const int32_t q : reqs) {
      std::map<int64_t, std::array<uint32_t, 4>> blocks;
      for (int j = 0; j < rows; ++j) {
        if ((bad >> j & 1u) != 0 || p.req_ids[row0 + j] != q) continue;
        for (const auto& [b, mask] : sel[size_t(j)]) {
          std::array<uint32_t, 4>& tw = blocks[b];
          for (int i = 0; i < 4; ++i)
            if (mask >> i & 1) tw[i] |= 1u << j;
        }
      }
      const int32_t* table = p.block_table + int64_t(q) * p.block_table_stride;
      for (auto& [b, tw] : blocks) {
        const int64_t t = 4 * b;  // the block's first token: same logical page as its others
        int32_t* pb = w.data() + qsa::group_blocks_offset(R) + 2 * (first + count);
        pb[0] = table[t / p.page_size];
        pb[1] = int32_t(t % p.page_size);
        uint32_t* words = reinterpret_cast<uint32_t*>(w.data() + qsa::group_tokw_offset(R, K) + 4 * (first + count));
        std::copy(tw.begin(), tw.end(), words);
        uses += std::popcount(tw[0] | tw[1] | tw[2] | tw[3]);
        ++count;
      }
    }
    if (hand_over && count > 0 && uses * qsa::kGroupSharingDen < qsa::kGroupSharingNum * count) {  // too little sharing: the fix-up pass takes every row
      std::fill(w.begin() + qsa::group_blocks_offset(R) + 2 * first, w.begin() + qsa::group_blocks_offset(R) + 2 * (first + count), 0);
      std::fill(w.begin() + qsa::group_tokw_offset(R, K) + 4 * first, w.begin() + qsa::group_tokw_offset(R, K) + 4 * (first + count), 0);
      count = 0;
      bad = rows >= 32 ? ~0u : (1u << rows) - 1u;
    }
    int32_t* ge = w.data() + qsa::group_table_offset() + 4 * g;
    ge[0] = int32_t(first);
    ge[1] = int32_t(count);
    ge[2] = int32_t(bad);
  }
  return w;
}

}  // namespace selkv::ref
