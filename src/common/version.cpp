#include "selkv/version.h"

namespace selkv {

const char* version() { return SELKV_VERSION_STRING; }

}  // namespace selkv
