// selkv — selected-KV (sparse) attention kernels and FP8 KV-cache operations for Hopper.
// Umbrella header: includes the whole public C++ API.
#pragma once

#include "selkv/version.h"
#include "selkv/status.h"
#include "selkv/formats.h"
#include "selkv/cache_ops.h"
#include "selkv/decode.h"
#include "selkv/packed.h"
#include "selkv/dequant.h"
#include "selkv/prefill.h"
#include "selkv/composed.h"
#include "selkv/merge.h"
#include "selkv/qsa.h"
