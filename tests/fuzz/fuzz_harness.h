// A bounded mutation fuzzer for GoogleTest: seeded mutations (mutator.h) of a committed seed
// corpus (tests/fixtures/fuzz/<target>/*), run for a fixed number of inputs or seconds, whichever
// ends first, stopping at the first failing input. It runs in every build; the coverage-guided
// libFuzzer targets (libfuzzer_entry.cc, the `fuzz` preset with clang) run the same checks
// (fuzz_checks.h) over the same corpora.
//
// Environment: ORRERY_FUZZ_SECONDS (per target, default 2), ORRERY_FUZZ_ITERATIONS (default
// 200000), ORRERY_FUZZ_SEED (default 27). A failing input is written to
// $TMPDIR/orrery-fuzz-<target>-<n> so it can be added to the corpus.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "tests/fuzz/mutator.h"

namespace orrery::fuzz {

inline double EnvNumber(const char* name, double fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::atof(v) : fallback;
}

// The seed corpus of one target, sorted by file name (so runs are reproducible).
inline std::vector<std::string> LoadCorpus(const std::string& target) {
  const char* src = std::getenv("ORRERY_SOURCE_DIR");
  const std::filesystem::path dir =
      std::filesystem::path(src != nullptr ? src : ".") / "tests/fixtures/fuzz" / target;
  std::vector<std::filesystem::path> files;
  if (std::filesystem::is_directory(dir)) {
    for (const auto& e : std::filesystem::directory_iterator(dir)) {
      if (e.is_regular_file()) files.push_back(e.path());
    }
  }
  std::sort(files.begin(), files.end());
  std::vector<std::string> out;
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    out.push_back(ss.str());
  }
  return out;
}

// Runs `one` on every corpus entry, then on mutations until the budget is spent. `one` checks the
// invariants with EXPECT_*/ADD_FAILURE; an exception escaping it is a failure too. Returns the
// number of inputs run.
inline int64_t RunFuzzer(const std::string& target,
                         const std::function<void(Mutator&, const std::string&)>& one) {
  const std::vector<std::string> corpus = LoadCorpus(target);
  EXPECT_FALSE(corpus.empty()) << "no seed corpus in tests/fixtures/fuzz/" << target;
  if (corpus.empty()) return 0;
  const auto seed = static_cast<uint64_t>(EnvNumber("ORRERY_FUZZ_SEED", 27));
  const double seconds = EnvNumber("ORRERY_FUZZ_SECONDS", 2);
  const auto iterations = static_cast<int64_t>(EnvNumber("ORRERY_FUZZ_ITERATIONS", 200000));
  Mutator m(seed, corpus);
  const auto start = std::chrono::steady_clock::now();
  int64_t n = 0, failures = 0;
  auto run = [&](const std::string& input) {
    const bool failed_before = ::testing::Test::HasFailure();
    try {
      one(m, input);
    } catch (const std::exception& e) {
      ADD_FAILURE() << target << ": exception escaped: " << e.what();
    } catch (...) {
      ADD_FAILURE() << target << ": non-std exception escaped";
    }
    if (!failed_before && ::testing::Test::HasFailure()) {
      ++failures;
      const char* tmp = std::getenv("TMPDIR");
      const std::string path = std::string(tmp != nullptr ? tmp : "/tmp") + "/orrery-fuzz-" +
                               target + "-" + std::to_string(n);
      std::ofstream(path, std::ios::binary) << input;
      ADD_FAILURE() << target << ": input " << n << " (seed " << seed << ") written to " << path;
    }
    ++n;
  };
  for (const std::string& c : corpus) run(c);
  while (n < iterations && failures == 0 &&
         std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() <
             seconds) {
    run(m.Next());
  }
  std::printf("fuzz %s: %lld inputs in %.2f s\n", target.c_str(), static_cast<long long>(n),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return n;
}

}  // namespace orrery::fuzz
