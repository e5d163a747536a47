// Helpers shared by the learner tests: temporary directories and a small in-memory corpus.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <string>
#include <vector>

#include "core/philox.h"
#include "learner/token_shards.h"

namespace orrery::testing_util {

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "orrery-learner-XXXXXX").string();
    path_ = ::mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Writes documents d = 0..n-1 with lengths from `lengths`, ids (d * 7 + i) % vocab, all targets,
// every `heldout_every`-th document held out (0: none).
inline void WriteCorpus(const std::string& dir, const std::vector<int64_t>& lengths, int vocab,
                        int heldout_every, int64_t shard_tokens = 1 << 20) {
  auto w = TokenShardWriter::Create({dir, shard_tokens, vocab, "test"});
  for (size_t d = 0; d < lengths.size(); ++d) {
    std::vector<int32_t> ids;
    for (int64_t i = 0; i < lengths[d]; ++i)
      ids.push_back(static_cast<int32_t>((d * 7 + i) % vocab));
    std::vector<uint8_t> mask(ids.size(), 1);
    const bool heldout =
        heldout_every > 0 && static_cast<int>(d % heldout_every) == heldout_every - 1;
    if (!(*w)->Add(ids, mask, DocumentKind::kText, heldout).ok()) std::abort();
  }
  if (!(*w)->Finish().ok()) std::abort();
}

// Documents of Philox-drawn lengths (10 to 10 + max_extra - 1 tokens) and tokens (a skewed
// unigram mix with runs of consecutive ids, so there is something to learn), every fifth held out.
inline void WriteRandomCorpus(const std::string& dir, int vocab, int docs = 60,
                              int64_t max_extra = 120, uint64_t seed = 11) {
  auto w = TokenShardWriter::Create({dir, 1 << 20, vocab, "test"});
  if (!w.ok()) std::abort();
  PhiloxGenerator gen(seed, 3);
  for (int d = 0; d < docs; ++d) {
    const int64_t len = 10 + static_cast<int64_t>(gen.UniformInt(max_extra));
    std::vector<int32_t> ids;
    for (int64_t i = 0; i < len; ++i) {
      const int32_t base = static_cast<int32_t>(gen.UniformInt(vocab));
      ids.push_back(i > 0 && gen.UniformInt(2) == 0 ? (ids.back() + 1) % vocab : base / 4);
    }
    std::vector<uint8_t> mask(ids.size(), 1);
    if (!(*w)->Add(ids, mask, DocumentKind::kText, d % 5 == 4).ok()) std::abort();
  }
  if (!(*w)->Finish().ok()) std::abort();
}

}  // namespace orrery::testing_util
