// Plain-text table for the CLI: columns sized to their content, numbers right-aligned.
#pragma once

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

namespace selkv::cli {

class Table {
 public:
  explicit Table(std::vector<std::string> header, std::vector<bool> right_align)
      : header_(std::move(header)), right_(std::move(right_align)) {
    right_.resize(header_.size(), false);
  }
  void add(std::vector<std::string> row) {
    row.resize(header_.size());
    rows_.push_back(std::move(row));
  }
  bool empty() const { return rows_.empty(); }
  void print(std::FILE* f = stdout) const {
    std::vector<size_t> w(header_.size());
    for (size_t c = 0; c < header_.size(); ++c) {
      w[c] = header_[c].size();
      for (const auto& r : rows_) w[c] = std::max(w[c], r[c].size());
    }
    print_row(f, header_, w);
    std::string rule;
    for (size_t c = 0; c < w.size(); ++c) rule += std::string(w[c], '-') + (c + 1 < w.size() ? "  " : "");
    std::fprintf(f, "%s\n", rule.c_str());
    for (const auto& r : rows_) print_row(f, r, w);
  }

 private:
  void print_row(std::FILE* f, const std::vector<std::string>& r, const std::vector<size_t>& w) const {
    std::string line;
    for (size_t c = 0; c < r.size(); ++c) {
      const std::string pad(w[c] - r[c].size(), ' ');
      line += right_[c] ? pad + r[c] : r[c] + (c + 1 < r.size() ? pad : "");
      if (c + 1 < r.size()) line += "  ";
    }
    std::fprintf(f, "%s\n", line.c_str());
  }
  std::vector<std::string> header_;
  std::vector<bool> right_;
  std::vector<std::vector<std::string>> rows_;
};

inline std::string fmt_num(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

}  // namespace selkv::cli
