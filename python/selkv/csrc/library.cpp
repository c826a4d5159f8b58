// The `selkv` torch operator namespace. Ops are defined next to their kernels, one file per op
// family, with TORCH_LIBRARY_FRAGMENT(selkv, m) (see op_utils.h for the pattern). This single
// TORCH_LIBRARY block owns the namespace, so loading two copies of the library (say, an installed
// wheel and a build tree) fails loudly at load time instead of mixing kernels.
#include <torch/library.h>

TORCH_LIBRARY(selkv, m) {}
