// Oracle for C9: merge partial attention results of KV shards by their log-sum-exp.
#include <cmath>
#include <limits>
#include <vector>

#include "common/check.h"
#include "reference/oracle.h"

namespace selkv::ref {

Status check_lse_merge_args(const float* outs, const float* lses, int num_shards, int64_t rows,
                            int dim, const float* out) {
  constexpr const char* kOp = "selkv::ref::lse_merge";
  SELKV_CHECK_ARG(num_shards >= 1, "num_shards", "must be >= 1, got ", num_shards);
  SELKV_CHECK_ARG(rows >= 0, "rows", "must be >= 0, got ", rows);
  SELKV_CHECK_ARG(dim >= 0, "dim", "must be >= 0, got ", dim);
  if (rows == 0) return Status::Ok();
  SELKV_CHECK_ARG(lses != nullptr, "lses", "must not be null");
  SELKV_CHECK_ARG(outs != nullptr || dim == 0, "outs", "must not be null");
  SELKV_CHECK_ARG(out != nullptr || dim == 0, "out", "must not be null");
  return Status::Ok();
}

void lse_merge(const float* outs, const float* lses, int num_shards, int64_t rows, int dim,
               float* out, float* lse, bool pos_inf_is_empty) {
  if (!check_lse_merge_args(outs, lses, num_shards, rows, dim, out).ok()) return;
  constexpr double kInf = std::numeric_limits<double>::infinity();
  std::vector<double> acc(dim);
  for (int64_t r = 0; r < rows; ++r) {
    float* o = out + r * dim;
    bool any_nan = false;
    int first_pos_inf = -1;
    double m = -kInf;
    for (int i = 0; i < num_shards; ++i) {
      double l = lses[int64_t(i) * rows + r];
      if (pos_inf_is_empty && l == kInf) l = -kInf;
      if (std::isnan(l)) any_nan = true;
      else if (l == kInf && first_pos_inf < 0) first_pos_inf = i;
      else if (l > m) m = l;
    }
    if (any_nan) {
      for (int c = 0; c < dim; ++c) o[c] = std::numeric_limits<float>::quiet_NaN();
      if (lse) lse[r] = std::numeric_limits<float>::quiet_NaN();
      continue;
    }
    if (first_pos_inf >= 0) {  // an infinitely heavy shard dominates every finite one
      const float* src = outs + (int64_t(first_pos_inf) * rows + r) * dim;
      for (int c = 0; c < dim; ++c) o[c] = src[c];
      if (lse) lse[r] = std::numeric_limits<float>::infinity();
      continue;
    }
    if (m == -kInf) {  // no shard saw a valid key
      for (int c = 0; c < dim; ++c) o[c] = 0.f;
      if (lse) lse[r] = -std::numeric_limits<float>::infinity();
      continue;
    }
    double wsum = 0.0;
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int i = 0; i < num_shards; ++i) {
      const double l = lses[int64_t(i) * rows + r];
      if (l == -kInf || (pos_inf_is_empty && l == kInf)) continue;  // empty shard: its out (0) must not enter, even as 0 * NaN
      const double w = std::exp(l - m);
      wsum += w;
      const float* src = outs + (int64_t(i) * rows + r) * dim;
      for (int c = 0; c < dim; ++c) acc[c] += w * double(src[c]);
    }
    for (int c = 0; c < dim; ++c) o[c] = float(acc[c] / wsum);
    if (lse) lse[r] = float(m + std::log(wsum));
  }
}

}  // namespace selkv::ref
