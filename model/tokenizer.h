// Byte-level BPE tokenizer, stored in the Hugging Face `tokenizers` JSON format.
//
// Every byte string encodes and decodes back to itself: the base vocabulary holds all 256 bytes,
// merges only join tokens, and special tokens are never produced from text (Encode treats
// "<|user|>" typed by a user as ordinary bytes, so text cannot forge chat structure; only the chat
// format inserts special ids).
//
// Pre-tokenization follows the GPT-2 pattern that the `tokenizers` ByteLevel pre-tokenizer uses
// ('s 't 're 've 'm 'll 'd, ` ?letters`, ` ?digits`, ` ?other`, whitespace runs), with one
// simplification: every byte >= 0x80 counts as a letter, so a non-ASCII symbol may be split
// differently from the Unicode-class regex. Files written here load in `tokenizers` (BPE model,
// ByteLevel pre-tokenizer and decoder, special tokens as added_tokens); ids of ASCII text agree.
//
// Id layout of a trained tokenizer: special tokens first (0..S-1), then the 256 bytes in byte
// order, then one id per merge in merge order. Loaded files may use any layout.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/status.h"

namespace orrery {

class Tokenizer {
 public:
  // Reads a tokenizer.json (the `tokenizers` format; BPE model with ByteLevel pre-tokenizer).
  static StatusOr<Tokenizer> Load(const std::string& path);
  // Parses the JSON text; `source_name` names it in errors.
  static StatusOr<Tokenizer> FromJson(const std::string& json, const std::string& source_name);
  // Builds a tokenizer from merges over the byte alphabet (what the trainer produces).
  static Tokenizer FromMerges(const std::vector<std::string>& special_tokens,
                              const std::vector<std::pair<int32_t, int32_t>>& merges);

  std::string ToJson() const;
  Status Save(const std::string& path) const;  // atomic

  // Encodes raw bytes (special token text is not recognised).
  std::vector<int32_t> Encode(std::string_view text) const;
  // Bytes of the ids; special tokens decode to their text. Unknown ids are an error.
  StatusOr<std::string> Decode(const std::vector<int32_t>& ids) const;
  // The bytes one id stands for (its text for a special token); empty for an unknown id.
  std::string_view TokenBytes(int32_t id) const;

  // One more than the largest id.
  int32_t vocab_size() const { return static_cast<int32_t>(token_bytes_.size()); }
  int32_t num_merges() const { return static_cast<int32_t>(merges_.size()); }
  std::optional<int32_t> SpecialTokenId(std::string_view content) const;
  bool IsSpecial(int32_t id) const;
  const std::vector<std::string>& special_tokens() const { return special_contents_; }

  // Splits text into pre-tokens (byte ranges) as described above; exposed for the trainer.
  static void PreTokenize(std::string_view text, std::vector<std::string_view>* out);

 private:
  struct MergeRule {
    int32_t rank;
    int32_t result;
  };
  static uint64_t PairKey(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  void EncodeWord(std::string_view word, std::vector<int32_t>* out) const;
  void BuildMergeTable();

  std::vector<std::string> token_bytes_;             // id -> bytes (or special text)
  std::vector<uint8_t> is_special_;                  // id -> 1 for special tokens
  int32_t byte_ids_[256] = {};                       // byte -> id
  std::vector<std::pair<int32_t, int32_t>> merges_;  // in rank order
  std::unordered_map<uint64_t, MergeRule> merge_table_;
  std::vector<std::string> special_contents_;
  std::unordered_map<std::string, int32_t> special_ids_;
};

struct BpeTrainOptions {
  // Total vocabulary: special tokens + 256 bytes + merges. Must exceed specials + 256.
  int32_t vocab_size = 4096;
  std::vector<std::string> special_tokens;
  // Pairs seen fewer times than this are never merged (training may stop below vocab_size).
  int64_t min_pair_count = 2;
  // false: no merge involves a digit, so every digit stays its own token and a number is spelled
  // digit by digit, the same after a space, a quote or a newline (" 344" is " ", "3", "4", "4";
  // "344" is "3", "4", "4"). Copying a number is then copying the same ids, whatever surrounds
  // it: the calculator tasks' numbers move between the question, tool calls, tool results and
  // the answer in all of these contexts. The file is a plain BPE tokenizer either way.
  bool merge_digits = true;
};

// Learns BPE merges from text. Feed text with AddText (any number of calls), then Train.
class BpeTrainer {
 public:
  BpeTrainer();
  ~BpeTrainer();
  void AddText(std::string_view text);
  int64_t num_words() const;  // distinct pre-tokens seen
  StatusOr<Tokenizer> Train(const BpeTrainOptions& options) const;

 private:
  std::unordered_map<std::string, int64_t> word_counts_;
};

}  // namespace orrery
