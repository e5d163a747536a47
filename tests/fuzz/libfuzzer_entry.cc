// The libFuzzer entry point of one check of fuzz_checks.h, chosen when the target is built
// (ORRERY_FUZZ_CHECK, ORRERY_FUZZ_NAME; tests/fuzz/CMakeLists.txt makes one binary per check in
// the `fuzz` preset, clang with -fsanitize=fuzzer,address,undefined). A broken property aborts
// with its line on stderr, which libFuzzer reports as a crash and saves the input.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "tests/fuzz/fuzz_checks.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  // The check's other choices come from a mutator seeded by the input's own bytes (FNV-1a), with
  // the input as its only corpus entry: one input always takes one path, as libFuzzer requires.
  uint64_t seed = 1469598103934665603ull;
  for (size_t i = 0; i < size; ++i) seed = (seed ^ data[i]) * 1099511628211ull;
  orrery::fuzz::Mutator m(seed, {input});
  const std::string broken = orrery::fuzz::ORRERY_FUZZ_CHECK(m, input);
  if (!broken.empty()) {
    std::fprintf(stderr, "fuzz %s: %s\n", ORRERY_FUZZ_NAME, broken.c_str());
    std::abort();
  }
  return 0;
}
