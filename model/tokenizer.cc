#include "model/tokenizer.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <queue>
#include <unordered_set>

#include "core/file_io.h"
#include "core/safetensors.h"

namespace orrery {
namespace {

// GPT-2's reversible byte -> code point map: printable Latin-1 bytes map to themselves, the rest
// to 256, 257, ... in byte order. Vocabulary strings are the UTF-8 of these code points.
struct ByteUnicodeMap {
  uint32_t code_point[256];
  std::unordered_map<uint32_t, uint8_t> byte_of;
  ByteUnicodeMap() {
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      code_point[b] = printable ? static_cast<uint32_t>(b) : next++;
      byte_of[code_point[b]] = static_cast<uint8_t>(b);
    }
  }
};

const ByteUnicodeMap& ByteMap() {
  static const ByteUnicodeMap* map = new ByteUnicodeMap();
  return *map;
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// Bytes -> the byte-level vocabulary string.
std::string BytesToVocabString(std::string_view bytes) {
  std::string out;
  for (unsigned char c : bytes) AppendUtf8(ByteMap().code_point[c], &out);
  return out;
}

// The inverse; false when the string holds a code point outside the byte map.
bool VocabStringToBytes(std::string_view s, std::string* out) {
  out->clear();
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    uint32_t cp;
    int len;
    if (c < 0x80) {
      cp = c, len = 1;
    } else if ((c & 0xE0) == 0xC0) {
      cp = c & 0x1F, len = 2;
    } else if ((c & 0xF0) == 0xE0) {
      cp = c & 0x0F, len = 3;
    } else {
      return false;
    }
    if (i + len > s.size()) return false;
    for (int k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
    auto it = ByteMap().byte_of.find(cp);
    if (it == ByteMap().byte_of.end()) return false;
    out->push_back(static_cast<char>(it->second));
    i += len;
  }
  return true;
}

bool IsSpace(unsigned char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}
bool IsLetter(unsigned char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c >= 0x80;
}
bool IsDigit(unsigned char c) { return c >= '0' && c <= '9'; }
bool IsOther(unsigned char c) { return !IsSpace(c) && !IsLetter(c) && !IsDigit(c); }

}  // namespace

void Tokenizer::PreTokenize(std::string_view text, std::vector<std::string_view>* out) {
  const size_t n = text.size();
  auto at = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  auto run = [&](size_t i, bool (*cls)(unsigned char)) {
    while (i < n && cls(at(i))) ++i;
    return i;
  };
  size_t i = 0;
  while (i < n) {
    const unsigned char c = at(i);
    size_t end = i;
    if (c == '\'') {  // contractions: 's 't 're 've 'm 'll 'd
      for (std::string_view suffix : {"s", "t", "re", "ve", "m", "ll", "d"}) {
        if (text.substr(i + 1, suffix.size()) == suffix) {
          end = i + 1 + suffix.size();
          break;
        }
      }
    }
    if (end == i) {
      const size_t j = (c == ' ' && i + 1 < n) ? i + 1 : i;  // optional leading space
      const unsigned char d = at(j);
      if (j < n && IsLetter(d)) {
        end = run(j, IsLetter);
      } else if (j < n && IsDigit(d)) {
        end = run(j, IsDigit);
      } else if (j < n && IsOther(d)) {
        end = run(j, IsOther);
      } else {
        // Whitespace: the whole run, except that a run longer than one followed by a non-space
        // leaves its last character to start the next pre-token (\s+(?!\S) then \s+).
        end = run(i, IsSpace);
        if (end < n && end - i > 1) --end;
      }
    }
    out->push_back(text.substr(i, end - i));
    i = end;
  }
}

Tokenizer Tokenizer::FromMerges(const std::vector<std::string>& special_tokens,
                                const std::vector<std::pair<int32_t, int32_t>>& merges) {
  Tokenizer t;
  for (const std::string& s : special_tokens) {
    t.special_ids_[s] = static_cast<int32_t>(t.token_bytes_.size());
    t.special_contents_.push_back(s);
    t.token_bytes_.push_back(s);
    t.is_special_.push_back(1);
  }
  for (int b = 0; b < 256; ++b) {
    t.byte_ids_[b] = static_cast<int32_t>(t.token_bytes_.size());
    t.token_bytes_.push_back(std::string(1, static_cast<char>(b)));
    t.is_special_.push_back(0);
  }
  // Two merges may spell the same bytes ("a"+"bc" and "ab"+"c"): they share one id.
  std::unordered_set<std::string> known(t.token_bytes_.begin() + special_tokens.size(),
                                        t.token_bytes_.end());
  for (const auto& [a, b] : merges) {
    std::string joined = t.token_bytes_[a] + t.token_bytes_[b];
    if (!known.insert(joined).second) continue;
    t.token_bytes_.push_back(std::move(joined));
    t.is_special_.push_back(0);
  }
  t.merges_ = merges;
  t.BuildMergeTable();
  return t;
}

void Tokenizer::BuildMergeTable() {
  // The result of merge r is the id whose bytes are the concatenation; for trained tokenizers it
  // is S + 256 + r, for loaded ones it comes from the vocabulary (resolved by FromJson).
  merge_table_.clear();
  std::unordered_map<std::string, int32_t> id_of;
  for (int32_t id = 0; id < vocab_size(); ++id) {
    if (!is_special_[id]) id_of.emplace(token_bytes_[id], id);
  }
  for (int32_t r = 0; r < num_merges(); ++r) {
    const auto& [a, b] = merges_[r];
    const int32_t result = id_of.at(token_bytes_[a] + token_bytes_[b]);
    merge_table_.emplace(PairKey(a, b), MergeRule{r, result});
  }
}

void Tokenizer::EncodeWord(std::string_view word, std::vector<int32_t>* out) const {
  std::vector<int32_t> ids;
  ids.reserve(word.size());
  for (unsigned char c : word) ids.push_back(byte_ids_[c]);
  // Repeatedly apply the lowest-rank merge present (all its occurrences, left to right).
  while (ids.size() > 1) {
    int32_t best_rank = INT32_MAX, best_result = -1;
    uint64_t best_key = 0;
    for (size_t i = 0; i + 1 < ids.size(); ++i) {
      auto it = merge_table_.find(PairKey(ids[i], ids[i + 1]));
      if (it != merge_table_.end() && it->second.rank < best_rank) {
        best_rank = it->second.rank;
        best_result = it->second.result;
        best_key = it->first;
      }
    }
    if (best_result < 0) break;
    size_t w = 0;
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i + 1 < ids.size() && PairKey(ids[i], ids[i + 1]) == best_key) {
        ids[w++] = best_result;
        ++i;
      } else {
        ids[w++] = ids[i];
      }
    }
    ids.resize(w);
  }
  out->insert(out->end(), ids.begin(), ids.end());
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text) const {
  std::vector<std::string_view> words;
  PreTokenize(text, &words);
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 1);
  for (std::string_view w : words) EncodeWord(w, &out);
  return out;
}

StatusOr<std::string> Tokenizer::Decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size()) {
      return OutOfRangeError("token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                             std::to_string(vocab_size()) + ")");
    }
    out += token_bytes_[id];
  }
  return out;
}

std::string_view Tokenizer::TokenBytes(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return {};
  return token_bytes_[id];
}

std::optional<int32_t> Tokenizer::SpecialTokenId(std::string_view content) const {
  auto it = special_ids_.find(std::string(content));
  if (it == special_ids_.end()) return std::nullopt;
  return it->second;
}

bool Tokenizer::IsSpecial(int32_t id) const {
  return id >= 0 && id < vocab_size() && is_special_[id] != 0;
}

std::string Tokenizer::ToJson() const {
  using nlohmann::ordered_json;
  ordered_json j;
  j["version"] = "1.0";
  j["truncation"] = nullptr;
  j["padding"] = nullptr;
  j["added_tokens"] = ordered_json::array();
  for (const std::string& s : special_contents_) {
    j["added_tokens"].push_back({{"id", special_ids_.at(s)},
                                 {"content", s},
                                 {"single_word", false},
                                 {"lstrip", false},
                                 {"rstrip", false},
                                 {"normalized", false},
                                 {"special", true}});
  }
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = {{"type", "ByteLevel"},
                        {"add_prefix_space", false},
                        {"trim_offsets", true},
                        {"use_regex", true}};
  j["post_processor"] = nullptr;
  j["decoder"] = {{"type", "ByteLevel"},
                  {"add_prefix_space", false},
                  {"trim_offsets", true},
                  {"use_regex", true}};
  ordered_json vocab = ordered_json::object();
  for (int32_t id = 0; id < vocab_size(); ++id) {
    if (is_special_[id]) continue;
    vocab[BytesToVocabString(token_bytes_[id])] = id;
  }
  ordered_json merges = ordered_json::array();
  for (const auto& [a, b] : merges_) {
    merges.push_back(BytesToVocabString(token_bytes_[a]) + " " +
                     BytesToVocabString(token_bytes_[b]));
  }
  j["model"] = {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", nullptr},
                {"continuing_subword_prefix", nullptr},
                {"end_of_word_suffix", nullptr},
                {"fuse_unk", false},
                {"byte_fallback", false},
                {"vocab", vocab},
                {"merges", merges}};
  return j.dump(1) + "\n";
}

Status Tokenizer::Save(const std::string& path) const { return WriteFileAtomic(path, ToJson()); }

StatusOr<Tokenizer> Tokenizer::Load(const std::string& path) {
  ORRERY_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  return FromJson(text, path);
}

StatusOr<Tokenizer> Tokenizer::FromJson(const std::string& json, const std::string& source_name) {
  auto bad = [&](const std::string& what) {
    return InvalidArgumentError(source_name + ": " + what);
  };
  nlohmann::json j = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return bad("not a JSON object");
  if (!j.contains("model") || !j["model"].is_object()) return bad("missing 'model' object");
  const nlohmann::json& model = j["model"];
  if (model.value("type", std::string("BPE")) != "BPE") {
    return bad("model.type is '" + model["type"].dump() + "', expected \"BPE\"");
  }
  if (!j.contains("pre_tokenizer") || !j["pre_tokenizer"].is_object() ||
      j["pre_tokenizer"].value("type", std::string()) != "ByteLevel") {
    return bad("pre_tokenizer must be {\"type\": \"ByteLevel\", ...}");
  }
  if (!model.contains("vocab") || !model["vocab"].is_object()) return bad("missing model.vocab");
  if (!model.contains("merges") || !model["merges"].is_array()) return bad("missing model.merges");

  Tokenizer t;
  int32_t max_id = -1;
  std::vector<std::pair<int32_t, std::string>> entries;  // (id, bytes or special text)
  std::vector<uint8_t> special_flags;
  std::string bytes;
  for (const auto& [key, value] : model["vocab"].items()) {
    if (!value.is_number_integer() || value.get<int64_t>() < 0 ||
        value.get<int64_t>() > INT32_MAX) {
      return bad("model.vocab[\"" + key + "\"] must be a non-negative integer id");
    }
    if (!VocabStringToBytes(key, &bytes)) {
      return bad("model.vocab key \"" + key + "\" is not a byte-level token");
    }
    entries.emplace_back(value.get<int32_t>(), bytes);
    special_flags.push_back(0);
  }
  if (j.contains("added_tokens") && j["added_tokens"].is_array()) {
    for (const auto& a : j["added_tokens"]) {
      if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() ||
          !a.contains("content") || !a["content"].is_string()) {
        return bad("every added_tokens entry needs an integer 'id' and a string 'content'");
      }
      const int32_t id = a["id"].get<int32_t>();
      if (id < 0) return bad("added token with negative id");
      entries.emplace_back(id, a["content"].get<std::string>());
      special_flags.push_back(1);
    }
  }
  for (const auto& e : entries) max_id = std::max(max_id, e.first);
  t.token_bytes_.assign(max_id + 1, std::string());
  t.is_special_.assign(max_id + 1, 0);
  std::vector<uint8_t> seen(max_id + 1, 0);
  for (int b = 0; b < 256; ++b) t.byte_ids_[b] = -1;
  for (size_t k = 0; k < entries.size(); ++k) {
    const auto& [id, content] = entries[k];
    if (seen[id]) {
      if (special_flags[k] && !t.is_special_[id] && t.token_bytes_[id] == content) {
        continue;  // the `tokenizers` library also lists added tokens in the vocab
      }
      return bad("id " + std::to_string(id) + " is used twice");
    }
    seen[id] = 1;
    t.token_bytes_[id] = content;
    t.is_special_[id] = special_flags[k];
    if (special_flags[k]) {
      t.special_ids_[content] = id;
      t.special_contents_.push_back(content);
    } else if (content.size() == 1) {
      t.byte_ids_[static_cast<unsigned char>(content[0])] = id;
    }
  }
  for (int32_t id = 0; id <= max_id; ++id) {
    if (!seen[id]) return bad("ids are not contiguous: id " + std::to_string(id) + " is missing");
  }
  for (int b = 0; b < 256; ++b) {
    if (t.byte_ids_[b] < 0) {
      return bad("vocabulary lacks byte 0x" + std::to_string(b) +
                 " (a byte-level BPE needs all 256 bytes)");
    }
  }
  std::unordered_map<std::string, int32_t> id_of;
  for (int32_t id = 0; id <= max_id; ++id) {
    if (!t.is_special_[id]) id_of.emplace(t.token_bytes_[id], id);
  }
  std::string left, right;
  for (size_t r = 0; r < model["merges"].size(); ++r) {
    const nlohmann::json& m = model["merges"][r];
    std::string a, b;
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const size_t sp = s.find(' ');
      if (sp == std::string::npos) return bad("merge " + std::to_string(r) + " has no space");
      a = s.substr(0, sp), b = s.substr(sp + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      a = m[0].get<std::string>(), b = m[1].get<std::string>();
    } else {
      return bad("merge " + std::to_string(r) + " is neither \"a b\" nor [\"a\", \"b\"]");
    }
    if (!VocabStringToBytes(a, &left) || !VocabStringToBytes(b, &right) || !id_of.count(left) ||
        !id_of.count(right) || !id_of.count(left + right)) {
      return bad("merge " + std::to_string(r) + " (\"" + a + " " + b +
                 "\") uses tokens missing from the vocabulary");
    }
    t.merges_.emplace_back(id_of[left], id_of[right]);
  }
  t.BuildMergeTable();
  return t;
}

// ---------------------------------------------------------------------------------------------
// Training: classic BPE over distinct pre-tokens weighted by their counts. Pair counts live in a
// hash map with a lazy max-heap on top; each merge touches only the words that contain the pair
// (an inverted index), so the cost per merge is proportional to the words it changes.

BpeTrainer::BpeTrainer() = default;
BpeTrainer::~BpeTrainer() = default;

void BpeTrainer::AddText(std::string_view text) {
  std::vector<std::string_view> words;
  Tokenizer::PreTokenize(text, &words);
  for (std::string_view w : words) ++word_counts_[std::string(w)];
}

int64_t BpeTrainer::num_words() const { return static_cast<int64_t>(word_counts_.size()); }

StatusOr<Tokenizer> BpeTrainer::Train(const BpeTrainOptions& options) const {
  const int32_t num_special = static_cast<int32_t>(options.special_tokens.size());
  const int32_t base = num_special + 256;
  if (options.vocab_size <= base) {
    return InvalidArgumentError("vocab size " + std::to_string(options.vocab_size) +
                                " must exceed the special tokens plus 256 bytes (" +
                                std::to_string(base) + ")");
  }
  std::unordered_set<std::string> distinct(options.special_tokens.begin(),
                                           options.special_tokens.end());
  if (distinct.size() != options.special_tokens.size()) {
    return InvalidArgumentError("special tokens must be distinct");
  }
  // Deterministic word order (the hash map's order is not).
  std::vector<std::pair<std::string, int64_t>> sorted(word_counts_.begin(), word_counts_.end());
  std::sort(sorted.begin(), sorted.end());
  struct Word {
    std::vector<int32_t> syms;
    int64_t count;
  };
  std::vector<Word> words;
  words.reserve(sorted.size());
  for (const auto& [w, c] : sorted) {
    Word word{{}, c};
    for (unsigned char ch : w) word.syms.push_back(num_special + ch);
    words.push_back(std::move(word));
  }
  auto key = [](int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  };
  // Without digit merges the only tokens holding a digit are the ten digit bytes: a pair with one
  // of them is never counted, so never merged.
  auto is_digit_id = [&](int32_t id) { return id >= num_special + '0' && id <= num_special + '9'; };
  auto mergeable = [&](int32_t a, int32_t b) {
    return options.merge_digits || (!is_digit_id(a) && !is_digit_id(b));
  };
  std::unordered_map<uint64_t, int64_t> pair_count;
  std::unordered_map<uint64_t, std::vector<int32_t>> where;  // may hold stale or repeated words
  for (int32_t wi = 0; wi < static_cast<int32_t>(words.size()); ++wi) {
    const Word& w = words[wi];
    for (size_t i = 0; i + 1 < w.syms.size(); ++i) {
      if (!mergeable(w.syms[i], w.syms[i + 1])) continue;
      const uint64_t k = key(w.syms[i], w.syms[i + 1]);
      pair_count[k] += w.count;
      auto& list = where[k];
      if (list.empty() || list.back() != wi) list.push_back(wi);
    }
  }
  // Max-heap by count; ties go to the smaller pair key so training is deterministic.
  using Entry = std::pair<int64_t, uint64_t>;
  auto cmp = [](const Entry& x, const Entry& y) {
    return x.first != y.first ? x.first < y.first : x.second > y.second;
  };
  std::priority_queue<Entry, std::vector<Entry>, decltype(cmp)> heap(cmp);
  for (const auto& [k, c] : pair_count) heap.push({c, k});

  std::vector<std::pair<int32_t, int32_t>> merges;
  const int32_t target = options.vocab_size - base;
  // Token bytes by id (from `base` on), to give a merge that re-spells a token that token's id.
  std::vector<std::string> token_bytes;
  std::unordered_map<std::string, int32_t> id_of_bytes;
  for (int c = 0; c < 256; ++c) {
    token_bytes.push_back(std::string(1, static_cast<char>(c)));
    id_of_bytes[token_bytes.back()] = num_special + c;
  }
  int32_t num_tokens = 0;  // new tokens created so far
  std::unordered_map<uint64_t, int64_t> delta;
  while (num_tokens < target && !heap.empty()) {
    const auto [count, k] = heap.top();
    heap.pop();
    auto pc = pair_count.find(k);
    const int64_t current = pc == pair_count.end() ? 0 : pc->second;
    if (current != count) {  // stale entry
      if (current > 0) heap.push({current, k});
      continue;
    }
    if (count < options.min_pair_count) break;
    const int32_t a = static_cast<int32_t>(k >> 32), b = static_cast<int32_t>(k & 0xffffffffu);
    std::string joined = token_bytes[a - num_special] + token_bytes[b - num_special];
    int32_t new_id;
    if (auto it = id_of_bytes.find(joined); it != id_of_bytes.end()) {
      new_id = it->second;
    } else {
      new_id = base + num_tokens++;
      id_of_bytes.emplace(joined, new_id);
      token_bytes.push_back(std::move(joined));
    }
    merges.emplace_back(a, b);
    std::vector<int32_t> affected = std::move(where[k]);
    where.erase(k);
    delta.clear();
    for (int32_t wi : affected) {
      Word& w = words[wi];
      bool has = false;
      for (size_t i = 0; i + 1 < w.syms.size(); ++i) {
        if (w.syms[i] == a && w.syms[i + 1] == b) has = true;
      }
      if (!has) continue;
      for (size_t i = 0; i + 1 < w.syms.size(); ++i) {
        if (mergeable(w.syms[i], w.syms[i + 1])) delta[key(w.syms[i], w.syms[i + 1])] -= w.count;
      }
      size_t out = 0;
      for (size_t i = 0; i < w.syms.size(); ++i) {
        if (i + 1 < w.syms.size() && w.syms[i] == a && w.syms[i + 1] == b) {
          w.syms[out++] = new_id;
          ++i;
        } else {
          w.syms[out++] = w.syms[i];
        }
      }
      w.syms.resize(out);
      for (size_t i = 0; i + 1 < w.syms.size(); ++i) {
        if (!mergeable(w.syms[i], w.syms[i + 1])) continue;
        const uint64_t nk = key(w.syms[i], w.syms[i + 1]);
        delta[nk] += w.count;
        if (w.syms[i] == new_id || w.syms[i + 1] == new_id) {
          auto& list = where[nk];
          if (list.empty() || list.back() != wi) list.push_back(wi);
        }
      }
    }
    pair_count.erase(k);
    delta.erase(k);
    for (const auto& [dk, d] : delta) {
      if (d == 0) continue;
      int64_t& c = pair_count[dk];
      c += d;
      if (d > 0) heap.push({c, dk});
      if (c <= 0) pair_count.erase(dk);
    }
  }
  return Tokenizer::FromMerges(options.special_tokens, merges);
}

}  // namespace orrery
