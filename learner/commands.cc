#include "learner/commands.h"

#include <cstdio>
#include <filesystem>

#include "core/file_io.h"
#include "core/logging.h"
#include "learner/data_prepare.h"
#include "learner/pretrain_commands.h"
#include "learner/pretrain_config.h"
#include "model/chat_format.h"
#include "model/tokenizer.h"

namespace orrery {
namespace {

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

int TokenizerTrain(const CliArgs& args) {
  const int64_t vocab = args.Int("vocab-size");
  if (vocab <= static_cast<int64_t>(ChatSpecialTokens().size()) + 256 || vocab > (1 << 24)) {
    return ReportError(InvalidArgumentError(
        "--vocab-size " + std::to_string(vocab) + ": expected more than " +
        std::to_string(ChatSpecialTokens().size() + 256) + " (chat tokens + 256 bytes)"));
  }
  BpeTrainer trainer;
  int64_t bytes = 0;
  for (const std::string& path : args.List("input")) {
    StatusOr<std::string> text = ReadFileToString(path);
    if (!text.ok()) return ReportError(text.status());
    bytes += static_cast<int64_t>(text->size());
    if (EndsWith(path, ".jsonl")) {
      // Train on what the chat format will encode: contents and tool-call JSON bodies.
      StatusOr<std::vector<std::vector<ChatMessage>>> chats = ParseChatTranscripts(path, *text);
      if (!chats.ok()) return ReportError(chats.status());
      for (const auto& messages : *chats) {
        for (const ChatMessage& m : messages) {
          trainer.AddText(m.content);
          for (const ToolCall& c : m.tool_calls) {
            trainer.AddText("{\"name\":\"" + c.name + "\",\"arguments\":" + c.arguments_json + "}");
          }
        }
      }
    } else {
      trainer.AddText(*text);
    }
  }
  BpeTrainOptions options;
  options.vocab_size = static_cast<int32_t>(vocab);
  options.special_tokens = ChatSpecialTokens();
  options.min_pair_count = args.Int("min-count", 2);
  options.merge_digits = !args.Flag("split-digits");
  StatusOr<Tokenizer> tok = trainer.Train(options);
  if (!tok.ok()) return ReportError(tok.status());
  const std::string out = args.Get("out");
  Status s = tok->Save(out);
  if (!s.ok()) return ReportError(s);
  std::printf(
      "tokenizer: %lld bytes of input, %lld distinct pre-tokens -> %s (vocab %d: %zu "
      "special, 256 bytes, %d merges)\n",
      static_cast<long long>(bytes), static_cast<long long>(trainer.num_words()), out.c_str(),
      tok->vocab_size(), ChatSpecialTokens().size(), tok->num_merges());
  return 0;
}

int DataPrepare(const CliArgs& args) {
  DataPrepareOptions o;
  o.tokenizer_path = args.Get("tokenizer");
  o.inputs = args.List("input");
  o.out_dir = args.Get("out");
  o.heldout_fraction = args.Float("heldout-fraction", 0.02);
  o.seed = static_cast<uint64_t>(args.Int("seed", 0));
  o.text_document_chars = args.Int("doc-chars", 8192);
  StatusOr<DataPrepareSummary> s = PrepareData(o);
  if (!s.ok()) return ReportError(s.status());
  // The data directory carries its tokenizer, so training and generation need only the directory.
  std::error_code ec;
  std::filesystem::copy_file(o.tokenizer_path, o.out_dir + "/tokenizer.json",
                             std::filesystem::copy_options::overwrite_existing, ec);
  if (ec) return ReportError(IoError("copy tokenizer into " + o.out_dir + ": " + ec.message()));
  std::printf(
      "data: %lld documents (%lld text, %lld chat; %lld held out), %lld tokens "
      "(%lld targets) from %lld bytes -> %s\n",
      static_cast<long long>(s->documents), static_cast<long long>(s->text_documents),
      static_cast<long long>(s->chat_documents), static_cast<long long>(s->heldout_documents),
      static_cast<long long>(s->tokens), static_cast<long long>(s->target_tokens),
      static_cast<long long>(s->input_bytes), o.out_dir.c_str());
  return 0;
}

}  // namespace

void RegisterLearnerCommands(CliRegistry& registry) {
  // [pretrain] owns [optimizer] and [[stages]] too; alone they are read by the same reader.
  registry.config_sections().Add("pretrain", [](ConfigTable& root) { ReadPretrainConfig(root); });
  registry.config_sections().AddKeyExample("[pretrain]\n[[stages]]\nseq_len = 256\ntokens = 1\n");
  for (const char* key : {"optimizer", "stages"}) {
    registry.config_sections().Add(key, [](ConfigTable& root) {
      if (!root.Has("pretrain")) ReadPretrainConfig(root);
    });
  }

  registry.AddGroup({"tokenizer"}, "Train and inspect byte-level BPE tokenizers");
  registry.Add(CliCommand{
      {"tokenizer", "train"},
      "Train a byte-level BPE tokenizer (Hugging Face tokenizers JSON) with the chat tokens",
      {{"--input", "text files, or chat-transcript .jsonl", CliKind::kStringList, true, ""},
       {"--vocab-size", "total vocabulary size", CliKind::kInt, true, ""},
       {"--out", "tokenizer.json to write", CliKind::kString, true, ""},
       {"--min-count", "never merge a pair seen fewer times", CliKind::kInt, false, "2"},
       {"--split-digits", "no merge involves a digit: numbers are spelled digit by digit",
        CliKind::kFlag, false, ""}},
      TokenizerTrain});

  registry.AddGroup({"data"}, "Prepare training data");
  registry.Add(CliCommand{
      {"data", "prepare"},
      "Tokenize text files and chat-transcript .jsonl into token shards with a document index",
      {{"--tokenizer", "tokenizer.json", CliKind::kString, true, ""},
       {"--input", "text files, or chat-transcript .jsonl", CliKind::kStringList, true, ""},
       {"--out", "output directory", CliKind::kString, true, ""},
       {"--heldout-fraction", "share of documents held out for evaluation", CliKind::kFloat, false,
        "0.02"},
       {"--seed", "seed of the held-out draw", CliKind::kInt, false, "0"},
       {"--doc-chars", "plain text is cut into documents of about this many characters",
        CliKind::kInt, false, "8192"}},
      DataPrepare});

  RegisterPretrainCommands(registry);
}

}  // namespace orrery
