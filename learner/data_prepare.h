// `orrery data prepare`: tokenizes plain-text files and chat-transcript JSONL into token shards.
//
// Inputs are recognised by extension:
//   *.jsonl  one conversation per line, {"messages": [...]} in the core/chat.h JSON form (what
//            `orrery env synth` writes); rendered with the chat format, so only what the assistant
//            writes is a training target.
//   other    plain UTF-8 text, cut into documents at blank lines: consecutive paragraphs are joined
//            until a document reaches `text_document_chars` (a paragraph longer than that is cut at
//            line ends), and each document ends with <|endoftext|>. Every token is a target.
// A document is held out for evaluation with probability `heldout_fraction`, decided by a Philox
// draw on (seed, document number), so the split is reproducible and independent of thread count.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/chat.h"
#include "core/status.h"

namespace orrery {

struct DataPrepareOptions {
  std::string tokenizer_path;
  std::vector<std::string> inputs;
  std::string out_dir;
  double heldout_fraction = 0.02;
  uint64_t seed = 0;
  int64_t text_document_chars = 8192;
  int64_t shard_tokens = 16 << 20;
};

struct DataPrepareSummary {
  int64_t documents = 0;
  int64_t heldout_documents = 0;
  int64_t tokens = 0;
  int64_t target_tokens = 0;  // tokens whose loss mask is 1
  int64_t text_documents = 0;
  int64_t chat_documents = 0;
  int64_t input_bytes = 0;
};

StatusOr<DataPrepareSummary> PrepareData(const DataPrepareOptions& options);

// Parses chat-transcript JSONL ({"messages": [...]} per line); `path` names it in errors.
StatusOr<std::vector<std::vector<ChatMessage>>> ParseChatTranscripts(const std::string& path,
                                                                     const std::string& contents);

// Splits plain text into documents as described above (exposed for tests).
std::vector<std::string> SplitTextDocuments(const std::string& text, int64_t document_chars);

}  // namespace orrery
