#include "learner/data_prepare.h"

#include <fstream>
#include <sstream>

#include "core/chat.h"
#include "core/file_io.h"
#include "core/logging.h"
#include "core/philox.h"
#include "core/thread_pool.h"
#include "learner/token_shards.h"
#include "model/chat_format.h"
#include "model/tokenizer.h"

namespace orrery {
namespace {

constexpr uint64_t kHeldoutStream = 0x68656c64;  // "held"

}  // namespace

namespace {

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// One input's documents, before tokenization.
struct PendingDocument {
  DocumentKind kind;
  std::string text;                   // kText
  std::vector<ChatMessage> messages;  // kChat
};

}  // namespace

StatusOr<std::vector<std::vector<ChatMessage>>> ParseChatTranscripts(const std::string& path,
                                                                     const std::string& contents) {
  std::vector<std::vector<ChatMessage>> docs;
  std::istringstream lines(contents);
  std::string line;
  int64_t line_no = 0;
  while (std::getline(lines, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    // {"messages": [...]}: take the array and let core/chat.h parse it.
    const size_t key = line.find("\"messages\"");
    const size_t open = key == std::string::npos ? key : line.find('[', key);
    const size_t close = line.rfind(']');
    if (open == std::string::npos || close == std::string::npos || close < open) {
      return InvalidArgumentError(path + ":" + std::to_string(line_no) +
                                  ": expected {\"messages\": [...]}");
    }
    StatusOr<std::vector<ChatMessage>> messages =
        ChatMessagesFromJson(line.substr(open, close - open + 1));
    if (!messages.ok()) {
      return messages.status().WithContext(path + ":" + std::to_string(line_no));
    }
    docs.push_back(std::move(*messages));
  }
  return docs;
}

std::vector<std::string> SplitTextDocuments(const std::string& text, int64_t document_chars) {
  std::vector<std::string> docs;
  std::string current;
  auto flush = [&]() {
    if (current.find_first_not_of(" \t\r\n") != std::string::npos) docs.push_back(current);
    current.clear();
  };
  size_t pos = 0;
  while (pos < text.size()) {
    // The next paragraph: up to and including a blank line (or the end).
    size_t end = text.find("\n\n", pos);
    end = end == std::string::npos ? text.size() : end + 2;
    while (end < text.size() && text[end] == '\n') ++end;
    std::string_view para(text.data() + pos, end - pos);
    pos = end;
    if (!current.empty() && static_cast<int64_t>(current.size() + para.size()) > document_chars) {
      flush();
    }
    // A paragraph longer than a document is cut at line ends.
    while (static_cast<int64_t>(para.size()) > document_chars) {
      size_t cut = para.rfind('\n', document_chars);
      cut = (cut == std::string_view::npos || cut == 0) ? document_chars : cut + 1;
      current.append(para.substr(0, cut));
      flush();
      para.remove_prefix(cut);
    }
    current.append(para);
  }
  flush();
  return docs;
}

StatusOr<DataPrepareSummary> PrepareData(const DataPrepareOptions& options) {
  if (options.inputs.empty()) return InvalidArgumentError("data prepare: no --input files");
  if (options.heldout_fraction < 0 || options.heldout_fraction >= 1) {
    return InvalidArgumentError("data prepare: --heldout-fraction must be in [0, 1), got " +
                                std::to_string(options.heldout_fraction));
  }
  if (options.text_document_chars < 16) {
    return InvalidArgumentError("data prepare: --doc-chars must be at least 16");
  }
  ORRERY_ASSIGN_OR_RETURN(Tokenizer tokenizer, Tokenizer::Load(options.tokenizer_path));
  ORRERY_ASSIGN_OR_RETURN(ChatFormat format, ChatFormat::Create(&tokenizer));
  const std::string tokenizer_name =
      options.tokenizer_path.substr(options.tokenizer_path.find_last_of('/') + 1);
  ORRERY_ASSIGN_OR_RETURN(std::unique_ptr<TokenShardWriter> writer,
                          TokenShardWriter::Create({options.out_dir, options.shard_tokens,
                                                    tokenizer.vocab_size(), tokenizer_name}));
  DataPrepareSummary summary;
  for (const std::string& path : options.inputs) {
    ORRERY_ASSIGN_OR_RETURN(std::string contents, ReadFileToString(path));
    summary.input_bytes += static_cast<int64_t>(contents.size());
    std::vector<PendingDocument> docs;
    if (EndsWith(path, ".jsonl")) {
      ORRERY_ASSIGN_OR_RETURN(auto chats, ParseChatTranscripts(path, contents));
      for (auto& messages : chats) {
        docs.push_back(PendingDocument{DocumentKind::kChat, "", std::move(messages)});
      }
    } else {
      for (std::string& t : SplitTextDocuments(contents, options.text_document_chars)) {
        docs.push_back(PendingDocument{DocumentKind::kText, std::move(t), {}});
      }
    }
    if (docs.empty()) return InvalidArgumentError("input " + path + " holds no documents");
    std::vector<RenderedChat> rendered(docs.size());
    std::vector<Status> errors(docs.size());
    ThreadPool::Default().ParallelFor(
        static_cast<int64_t>(docs.size()), 16, [&](int64_t begin, int64_t end) {
          for (int64_t i = begin; i < end; ++i) {
            if (docs[i].kind == DocumentKind::kText) {
              rendered[i] = format.RenderText(docs[i].text);
            } else {
              StatusOr<RenderedChat> r = format.Render(docs[i].messages);
              if (r.ok())
                rendered[i] = std::move(*r);
              else
                errors[i] = r.status();
            }
          }
        });
    for (size_t i = 0; i < docs.size(); ++i) {
      if (!errors[i].ok()) return errors[i].WithContext(path + ": document " + std::to_string(i));
      const uint64_t doc_number = static_cast<uint64_t>(summary.documents);
      const bool heldout =
          PhiloxUniform(options.seed, kHeldoutStream, doc_number) <= options.heldout_fraction;
      ORRERY_RETURN_IF_ERROR(
          writer->Add(rendered[i].ids, rendered[i].loss_mask, docs[i].kind, heldout));
      ++summary.documents;
      summary.heldout_documents += heldout ? 1 : 0;
      summary.tokens += static_cast<int64_t>(rendered[i].ids.size());
      for (uint8_t m : rendered[i].loss_mask) summary.target_tokens += m;
      (docs[i].kind == DocumentKind::kText ? summary.text_documents : summary.chat_documents)++;
    }
    ORRERY_LOG(INFO) << "data prepare: " << path << ": " << docs.size() << " documents";
  }
  ORRERY_RETURN_IF_ERROR(writer->Finish());
  return summary;
}

}  // namespace orrery
