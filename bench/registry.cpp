#include "registry.h"

#include <algorithm>
#include <stdexcept>

namespace selkv::bench {

int64_t Params::get_int(const std::string& name, int64_t dflt) const {
  auto it = values_.find(name);
  if (it == values_.end()) return dflt;
  const std::string& v = it->second;
  size_t pos = 0;
  int64_t x = 0;
  try {
    x = std::stoll(v, &pos, 0);
  } catch (const std::exception&) {
    pos = 0;
  }
  // Accept a K/M suffix: --tokens 32K.
  if (pos > 0 && pos + 1 == v.size() && (v[pos] == 'K' || v[pos] == 'k')) return x * 1024;
  if (pos > 0 && pos + 1 == v.size() && (v[pos] == 'M' || v[pos] == 'm')) return x * 1024 * 1024;
  if (pos == 0 || pos != v.size()) throw std::invalid_argument("--" + name + ": not an integer: '" + v + "'");
  return x;
}

std::string Params::get_str(const std::string& name, const std::string& dflt) const {
  auto it = values_.find(name);
  return it == values_.end() ? dflt : it->second;
}

std::vector<OpSpec>& op_registry() {
  static std::vector<OpSpec> ops;
  return ops;
}

std::vector<BenchCase>& case_registry() {
  static std::vector<BenchCase> cases;
  return cases;
}

std::vector<const OpSpec*> sorted_ops() {
  std::vector<const OpSpec*> v;
  for (const auto& op : op_registry()) v.push_back(&op);
  std::stable_sort(v.begin(), v.end(), [](const OpSpec* a, const OpSpec* b) { return a->order < b->order; });
  return v;
}

const OpSpec* find_op(const std::string& key) {
  for (const auto& op : op_registry())
    if (op.key == key) return &op;
  return nullptr;
}

}  // namespace selkv::bench
