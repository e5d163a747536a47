// The retrieval environment: question answering over a long generated document (the
// long-context workload).
//
// Each task is a document of filler prose, `doc_tokens` words long (about one token each with a
// tokenizer trained on such text; 1K to 1M words) or, with `doc_tokens_max`, a length drawn
// uniformly in [doc_tokens, doc_tokens_max] per task, with `num_facts` facts planted at random
// positions ("The access code of the Amber Vault is 4821."), and a question about one of them
// (needle in a haystack, generated and checkable). Where the document is (`document`):
//   "tools"      the model cannot see it; it has
//                  search(query)          up to 5 case-insensitive matches: offset and a snippet
//                  read(offset, length)   the text [offset, offset + length), <= max_read_chars
//                Components: "correct", "searches", "reads".
//   "in_prompt"  the user turn carries the whole document, then the question; no tools, so an
//                episode is one long prompt and one short answer (the long-context RL episode).
//                Components: "correct", "doc_words" (the document's length), "depth" (where the
//                asked fact sits, 0 = start, 1 = end).
// Reward: 1 when the final "Answer: <value>" line equals the fact's value (case and surrounding
// spaces ignored), else 0, graded here, outside any sandbox.
// Tasks are a pure function of (seed, split, index); train and test use separate Philox streams.
//
// Options ([env.retrieval]): seed = 0, document = "tools", doc_tokens = 20000, doc_tokens_max = 0
// (0: every document doc_tokens long), num_facts = 8, max_read_chars = 4096 (tools only).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/config.h"
#include "env/env.h"

namespace orrery::env {

enum class RetrievalDocument { kTools, kInPrompt };

struct RetrievalEnvOptions {
  uint64_t seed = 0;
  int64_t doc_tokens = 20000;
  int num_facts = 8;
  int64_t max_read_chars = 4096;
  RetrievalDocument document = RetrievalDocument::kTools;
  // 0: every document is doc_tokens words; else each task's length is drawn uniformly in
  // [doc_tokens, doc_tokens_max].
  int64_t doc_tokens_max = 0;
};

inline constexpr int64_t kRetrievalMaxDocTokens = int64_t{1} << 20;

struct RetrievalTask {
  std::string document;
  std::string question;
  std::string answer;
  size_t answer_offset = 0;  // where the asked fact sits in the document
  int64_t doc_words = 0;     // the document's length in words (filler and facts' positions)
};

// InvalidArgument for options outside their ranges (the same ones the config reader enforces).
StatusOr<RetrievalTask> MakeRetrievalTask(const RetrievalEnvOptions& options, Split split,
                                          uint64_t index);

// The conversation an episode starts from: system instructions and the user turn (for
// "in_prompt", the document and the question).
std::vector<ChatMessage> RetrievalInitialMessages(const RetrievalTask& task,
                                                  RetrievalDocument document);

RetrievalEnvOptions ReadRetrievalEnvOptions(ConfigTable& table);
std::unique_ptr<Env> MakeRetrievalEnv(const RetrievalEnvOptions& options);

}  // namespace orrery::env
