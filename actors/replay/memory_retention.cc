#include "actors/replay/memory_retention.h"

#include <malloc.h>

#include <algorithm>
#include <climits>

#include "core/logging.h"

namespace orrery::replay {

void RetainFreedMemory(int64_t write_buffer_bytes) {
  constexpr int kMmapThreshold = 4 << 20;
  const int64_t trim_threshold =
      std::min<int64_t>(2 * std::max<int64_t>(write_buffer_bytes, 0) + (32ll << 20), INT_MAX);
  // Setting either also stops glibc from adjusting both thresholds on its own.
  if (mallopt(M_MMAP_THRESHOLD, kMmapThreshold) != 1 ||
      mallopt(M_TRIM_THRESHOLD, static_cast<int>(trim_threshold)) != 1) {
    ORRERY_LOG(WARN) << "replay: the allocator refused to keep freed memory (mallopt); the "
                        "store's resident memory will swing with its memtables";
  }
}

}  // namespace orrery::replay
