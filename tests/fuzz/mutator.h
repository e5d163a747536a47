// Mutations of fuzz inputs shared by the bounded GoogleTest harness (fuzz_harness.h) and the
// libFuzzer entry points (libfuzzer_entry.cc): bit flips, random and special bytes (invalid
// UTF-8, JSON punctuation, chat markers), deletions, truncations, splices of other corpus
// entries, deep nesting, JSON values replaced by ones of another type, duplicated chunks and huge
// strings. Seeded, so a failing run is reproducible; no GoogleTest dependency.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <random>
#include <string>
#include <vector>

namespace orrery::fuzz {

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

}  // namespace orrery::fuzz
