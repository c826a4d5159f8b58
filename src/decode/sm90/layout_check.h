// Host self-check of the hand-written smem offsets (k_tile_offset, p_tile_offset, the K-half and
// V-half offsets) against the CuTe layouts the wgmma descriptors are built from, of the epilogue's
// staging area, and of the producer's per-lane store offsets against k_tile_offset. CPU only.
#pragma once

#include <string>

namespace selkv::decode::sm90 {

// Empty string when every offset agrees (both formats' geometry, DecodeLayout); else a
// description of the first mismatch.
std::string check_tile_layouts();

}  // namespace selkv::decode::sm90
