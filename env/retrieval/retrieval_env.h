// The retrieval environment: question answering over a long generated document (the
// long-context workload).
//
// Each task is a document of `doc_tokens` words (about one token each; 1K to 1M) of filler prose
// with `num_facts` facts planted at random positions ("The access code of the Amber Vault is
// 4821."), and a question about one of them. The model cannot see the document; it has
//   search(query)          up to 5 case-insensitive matches: offset and a snippet around each
//   read(offset, length)   the document text [offset, offset + length), length <= max_read_chars
// Reward: 1 when the final "Answer: <value>" line equals the fact's value (case and surrounding
// spaces ignored), else 0. Components: "correct", "searches", "reads".
// Tasks are a pure function of (seed, split, index); train and test use separate Philox streams.
//
// Options ([env.retrieval]): seed = 0, doc_tokens = 20000, num_facts = 8, max_read_chars = 4096.
#pragma once

#include <memory>
#include <string>

#include "core/config.h"
#include "env/env.h"

namespace orrery::env {

struct RetrievalEnvOptions {
  uint64_t seed = 0;
  int64_t doc_tokens = 20000;
  int num_facts = 8;
  int64_t max_read_chars = 4096;
};

struct RetrievalTask {
  std::string document;
  std::string question;
  std::string answer;
  size_t answer_offset = 0;  // where the asked fact sits in the document
};

StatusOr<RetrievalTask> MakeRetrievalTask(const RetrievalEnvOptions& options, Split split,
                                          uint64_t index);

RetrievalEnvOptions ReadRetrievalEnvOptions(ConfigTable& table);
std::unique_ptr<Env> MakeRetrievalEnv(const RetrievalEnvOptions& options);

}  // namespace orrery::env
