// A bounded mutation fuzzer for GoogleTest: seeded mutations of a committed seed corpus
// (tests/fixtures/fuzz/<target>/*), run for a fixed number of inputs or seconds, whichever ends
// first, stopping at the first failing input. It stands in for libFuzzer in ./scripts/test.sh
// (Debian's clang 14 has -fsanitize=fuzzer; entry points over the same corpora and checks are not
// written yet).
//
// Environment: ORRERY_FUZZ_SECONDS (per target, default 2), ORRERY_FUZZ_ITERATIONS (default
// 200000), ORRERY_FUZZ_SEED (default 27). A failing input is written to
// $TMPDIR/orrery-fuzz-<target>-<n> so it can be added to the corpus.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <random>
#include <sstream>
#include <string>
#include <vector>

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

class Mutator {
 public:
  Mutator(uint64_t seed, std::vector<std::string> corpus)
      : rng_(seed), corpus_(std::move(corpus)) {}

  uint64_t Uniform(uint64_t n) { return n == 0 ? 0 : rng_() % n; }
  const std::string& Seed() { return corpus_[Uniform(corpus_.size())]; }
  const std::vector<std::string>& corpus() const { return corpus_; }

  // One to four mutations of a random corpus entry.
  std::string Next() {
    std::string s = Seed();
    const int n = 1 + static_cast<int>(Uniform(4));
    for (int i = 0; i < n; ++i) Mutate(&s);
    if (s.size() > (1u << 20)) s.resize(1u << 20);
    return s;
  }

  void Mutate(std::string* s) {
    static const char* const kValues[] = {"0",
                                          "-0",
                                          "1e999999",
                                          "-1e400",
                                          "123456789012345678901234567890",
                                          "1.7976931348623157e308",
                                          "18446744073709551615",
                                          "18446744073709551616",
                                          "-9223372036854775809",
                                          "4.9e-324",
                                          "null",
                                          "true",
                                          "false",
                                          "[]",
                                          "{}",
                                          "\"\"",
                                          "\"x\"",
                                          "[1,2,3]",
                                          "{\"a\":{}}",
                                          "\"\\ud800\"",
                                          "\"\\u0000\"",
                                          "NaN",
                                          "Infinity"};
    static const char* const kBytes[] = {"\xff",
                                         "\xc0\x80",
                                         "\xed\xa0\x80",
                                         "\xf4\x90\x80\x80",
                                         "\xe2\x82",
                                         "\x80",
                                         "\"",
                                         "\\",
                                         "\n",
                                         "\r\n",
                                         "\0",
                                         ",",
                                         ":",
                                         "{",
                                         "}",
                                         "[",
                                         "]",
                                         "<|end|>",
                                         "<|tool_call|>",
                                         "<|/tool_call|>",
                                         "<|assistant|>"};
    const size_t pos = Uniform(s->size() + 1);
    switch (Uniform(11)) {
      case 0:  // flip a bit
        if (!s->empty()) (*s)[Uniform(s->size())] ^= static_cast<char>(1u << Uniform(8));
        break;
      case 1:  // random byte
        s->insert(pos, 1, static_cast<char>(Uniform(256)));
        break;
      case 2: {  // delete a range
        if (s->empty()) break;
        const size_t at = Uniform(s->size());
        s->erase(at, 1 + Uniform(std::min<size_t>(16, s->size() - at)));
        break;
      }
      case 3:  // truncate
        s->resize(Uniform(s->size() + 1));
        break;
      case 4: {  // splice another entry
        const std::string& o = Seed();
        const size_t from = Uniform(o.size() + 1);
        s->insert(pos, o.substr(from, Uniform(o.size() - from + 1)));
        break;
      }
      case 5: {  // a special byte sequence: invalid UTF-8, JSON punctuation, chat markers
        const char* b = kBytes[Uniform(std::size(kBytes))];
        s->insert(pos, std::string(b, *b == '\0' ? 1 : std::strlen(b)));
        break;
      }
      case 6: {  // deep nesting, sometimes far past any stack
        const size_t depth = Uniform(4) == 0 ? 100000 + Uniform(100000) : 1 + Uniform(600);
        const bool arrays = Uniform(2) == 0;
        std::string open, close;
        for (size_t i = 0; i < depth; ++i) {
          open += arrays ? "[" : "{\"a\":";
          close += arrays ? "]" : "}";
        }
        *s = open + *s + close;
        break;
      }
      case 7:
      case 8: {  // replace a JSON value (after a ':' or '[' or ',') by one of another type
        std::vector<size_t> starts;
        for (size_t i = 0; i < s->size(); ++i) {
          const char c = (*s)[i];
          if (c == ':' || c == '[' || c == ',') starts.push_back(i + 1);
        }
        if (starts.empty()) break;
        const size_t at = starts[Uniform(starts.size())];
        size_t end = at, depth = 0;
        bool in_str = false;
        for (; end < s->size(); ++end) {
          const char c = (*s)[end];
          if (in_str) {
            if (c == '\\')
              ++end;
            else if (c == '"')
              in_str = false;
            continue;
          }
          if (c == '"')
            in_str = true;
          else if (c == '[' || c == '{')
            ++depth;
          else if (c == ']' || c == '}') {
            if (depth == 0) break;
            --depth;
          } else if (c == ',' && depth == 0)
            break;
        }
        s->replace(at, std::min(end, s->size()) - at, kValues[Uniform(std::size(kValues))]);
        break;
      }
      case 9: {  // duplicate a chunk
        if (s->empty()) break;
        const size_t at = Uniform(s->size());
        s->insert(pos, s->substr(at, 1 + Uniform(std::min<size_t>(64, s->size() - at))));
        break;
      }
      default:  // a huge string
        s->insert(pos, std::string(Uniform(1 << 16), static_cast<char>('a' + Uniform(26))));
        break;
    }
  }

 private:
  std::mt19937_64 rng_;
  std::vector<std::string> corpus_;
};

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
