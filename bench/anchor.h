// Optional interface of a Workload that has a reference time to compare with (e.g. FlashMLA's
// published time for the same case) and/or a performance target. tools/main.cpp looks for it
// with dynamic_cast and adds "anchor_us=...;anchor/ours=..." to the variant column and notes.
#pragma once

#include <string>

namespace selkv::bench {

struct AnchorInfo {
  double anchor_us = 0;        // reference time (0: none)
  std::string anchor_name;     // "FlashMLA H200"
  double target_us = 0;        // our time must be <= this (0: no target)
  std::string key;             // this case's id, for rel_key of later cases
  std::string rel_key;         // compare with the time of an earlier case with this key...
  double rel_max = 0;          // ...ours must be <= rel_max x that time (0: no such target)
};

class Anchored {
 public:
  virtual ~Anchored() = default;
  virtual AnchorInfo anchor() const = 0;
};

}  // namespace selkv::bench
