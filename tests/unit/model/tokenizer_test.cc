#include "model/tokenizer.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/philox.h"

namespace orrery {
namespace {

const char kCorpus[] =
    "In the beginning God created the heaven and the earth. And the earth was without form, and "
    "void; and darkness was upon the face of the deep. What is 12*7? It's 84. They'll say 3+4 = "
    "7.\n"
    "  indented line\twith tab\n\nnew paragraph   with   spaces ";

Tokenizer TrainSmall(int vocab = 400) {
  BpeTrainer trainer;
  for (int i = 0; i < 5; ++i) trainer.AddText(kCorpus);
  BpeTrainOptions options;
  options.vocab_size = vocab;
  options.special_tokens = {"<|endoftext|>", "<|user|>"};
  StatusOr<Tokenizer> t = trainer.Train(options);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return *std::move(t);
}

std::vector<std::string> Pieces(std::string_view text) {
  std::vector<std::string_view> views;
  Tokenizer::PreTokenize(text, &views);
  return std::vector<std::string>(views.begin(), views.end());
}

TEST(PreTokenizeTest, FollowsTheGpt2Pattern) {
  EXPECT_EQ(Pieces("Hello world"), (std::vector<std::string>{"Hello", " world"}));
  EXPECT_EQ(Pieces("it's 12+34!"), (std::vector<std::string>{"it", "'s", " 12", "+", "34", "!"}));
  // A whitespace run leaves its last space to the next word; a trailing run stays whole.
  EXPECT_EQ(Pieces("a   b  "), (std::vector<std::string>{"a", "  ", " b", "  "}));
  EXPECT_EQ(Pieces("x\n\ny"), (std::vector<std::string>{"x", "\n", "\n", "y"}));
  std::string joined;
  for (const std::string& p : Pieces(kCorpus)) joined += p;
  EXPECT_EQ(joined, kCorpus);  // pre-tokens partition the text
}

TEST(TokenizerTest, TrainingCompressesAndRoundTrips) {
  Tokenizer t = TrainSmall();
  EXPECT_GT(t.vocab_size(), 300);  // stops early once no pair repeats in this small text
  EXPECT_LE(t.vocab_size(), 400);
  EXPECT_EQ(*t.SpecialTokenId("<|endoftext|>"), 0);
  EXPECT_EQ(*t.SpecialTokenId("<|user|>"), 1);
  std::vector<int32_t> ids = t.Encode(kCorpus);
  EXPECT_LT(ids.size(), sizeof(kCorpus) / 3);  // merges learned on this text compress it
  StatusOr<std::string> back = t.Decode(ids);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, kCorpus);
}

TEST(TokenizerTest, RandomBytesRoundTrip) {
  Tokenizer t = TrainSmall();
  PhiloxGenerator rng(7, 0);
  for (int trial = 0; trial < 200; ++trial) {
    std::string s(rng.UniformInt(64), '\0');
    for (char& c : s) c = static_cast<char>(rng.UniformInt(256));
    if (trial % 2) {  // mix in corpus-like text so merges fire next to odd bytes
      s.insert(rng.UniformInt(s.size() + 1), " the earth");
    }
    StatusOr<std::string> back = t.Decode(t.Encode(s));
    ASSERT_TRUE(back.ok());
    ASSERT_EQ(*back, s) << "trial " << trial;
  }
}

TEST(TokenizerTest, SpecialTokenTextIsNotASpecialToken) {
  Tokenizer t = TrainSmall();
  std::vector<int32_t> ids = t.Encode("<|user|>");
  for (int32_t id : ids) EXPECT_FALSE(t.IsSpecial(id));
  EXPECT_EQ(*t.Decode(ids), "<|user|>");
  EXPECT_EQ(*t.Decode({1}), "<|user|>");
  EXPECT_FALSE(t.Decode({400}).ok());
  EXPECT_FALSE(t.Decode({-1}).ok());
}

TEST(TokenizerTest, JsonRoundTripKeepsIdsAndEncoding) {
  Tokenizer t = TrainSmall();
  const std::string json = t.ToJson();
  EXPECT_NE(json.find("\"type\": \"BPE\""), std::string::npos);
  EXPECT_NE(json.find("\"ByteLevel\""), std::string::npos);
  EXPECT_NE(json.find("\"\xC4\xA0the\""), std::string::npos);  // " the" as GPT-2 spells it
  StatusOr<Tokenizer> u = Tokenizer::FromJson(json, "mem");
  ASSERT_TRUE(u.ok()) << u.status().ToString();
  EXPECT_EQ(u->vocab_size(), t.vocab_size());
  EXPECT_EQ(u->num_merges(), t.num_merges());
  EXPECT_EQ(u->Encode(kCorpus), t.Encode(kCorpus));
  EXPECT_EQ(*u->SpecialTokenId("<|user|>"), 1);
}

TEST(TokenizerTest, LoadsTheMergeListAsPairs) {
  // The newer `tokenizers` format spells merges as ["a", "b"]; \u0120 is the byte-level space.
  Tokenizer base = Tokenizer::FromMerges({}, {});
  std::string json = base.ToJson();
  const size_t v = json.find("\"vocab\": {");
  ASSERT_NE(v, std::string::npos);
  json.insert(v + 10, "\"\\u0120a\": 256, ");
  const size_t m = json.find("\"merges\": []");
  ASSERT_NE(m, std::string::npos);
  json.replace(m, 13, "\"merges\": [[\"\\u0120\", \"a\"]]");
  StatusOr<Tokenizer> t = Tokenizer::FromJson(json, "pairs.json");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->Encode(" a"), (std::vector<int32_t>{256}));
}

TEST(TokenizerTest, RejectsBadFiles) {
  EXPECT_EQ(Tokenizer::FromJson("{", "x.json").status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(Tokenizer::FromJson(R"({"model": {"type": "WordPiece"}})", "x.json")
                .status()
                .message()
                .find("x.json: model.type"),
            std::string::npos);
  Tokenizer t = TrainSmall();
  std::string json = t.ToJson();
  // Drop the byte "!" from the vocabulary: a byte-level BPE must cover every byte.
  const size_t pos = json.find("\"!\": ");
  ASSERT_NE(pos, std::string::npos);
  json.replace(pos, 1, "\"\\u4e00");
  Status s = Tokenizer::FromJson(json, "broken.json").status();
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(Tokenizer::Load("/nonexistent/tokenizer.json").status().code(), StatusCode::kNotFound);
}

TEST(TokenizerTest, TrainingIsDeterministicAndChecksOptions) {
  EXPECT_EQ(TrainSmall().ToJson(), TrainSmall().ToJson());
  BpeTrainer trainer;
  trainer.AddText("abc");
  BpeTrainOptions options;
  options.vocab_size = 256;
  EXPECT_FALSE(trainer.Train(options).ok());
  options.vocab_size = 300;
  options.special_tokens = {"<a>", "<a>"};
  EXPECT_FALSE(trainer.Train(options).ok());
}

// merge_digits = false: numbers are spelled digit by digit in every context, so a number copied
// from " 344" (after a space) to "\"344" (after a quote) is the same ids; with digit merges the
// same corpus learns number tokens, and the two spellings differ.
TEST(TokenizerTest, WithoutDigitMergesNumbersAreDigitsEverywhere) {
  BpeTrainer trainer;
  for (int i = 0; i < 40; ++i) {
    trainer.AddText("What is 344 + 26? {\"expression\":\"344 + 26\"} 370\nAnswer: 370 ");
  }
  BpeTrainOptions options;
  options.vocab_size = 330;
  options.special_tokens = {"<|endoftext|>"};
  StatusOr<Tokenizer> merged = trainer.Train(options);
  options.merge_digits = false;
  StatusOr<Tokenizer> split = trainer.Train(options);
  ASSERT_TRUE(merged.ok() && split.ok());

  auto digit_ids = [](const Tokenizer& t, std::string_view text) {
    std::vector<int32_t> out;
    for (int32_t id : t.Encode(text)) {
      const std::string_view bytes = t.TokenBytes(id);
      if (bytes.find_first_of("0123456789") != std::string_view::npos) out.push_back(id);
    }
    return out;
  };
  const std::vector<int32_t> spaced = digit_ids(*split, " 344"),
                             quoted = digit_ids(*split, "\"344");
  EXPECT_EQ(spaced, quoted);
  ASSERT_EQ(spaced.size(), 3u);
  for (int32_t id : spaced) EXPECT_EQ(split->TokenBytes(id).size(), 1u);  // one digit each
  EXPECT_NE(digit_ids(*merged, " 344"), digit_ids(*merged, "\"344"));
  // Words still merge (the merges digits cannot take go to them), and numbers round-trip.
  const std::string words = "What is Answer: expression";
  EXPECT_LE(split->Encode(words).size(), merged->Encode(words).size());
  EXPECT_LT(split->Encode(words).size(), words.size() / 3);
  const std::string text = "What is 344 + 26? Answer: 370";
  EXPECT_EQ(*split->Decode(split->Encode(text)), text);
  for (int32_t id = 0; id < split->vocab_size(); ++id) {
    const std::string_view bytes = split->TokenBytes(id);
    if (bytes.size() > 1) {
      EXPECT_EQ(bytes.find_first_of("0123456789"), std::string_view::npos) << bytes;
    }
  }
}

TEST(TokenizerTest, MergesThatRespellATokenShareItsId) {
  // "ab"+"c" and "a"+"bc" can both be learned; the vocabulary must keep one "abc".
  BpeTrainer trainer;
  for (int i = 0; i < 50; ++i) trainer.AddText("ab abc bc xbc xab ");
  BpeTrainOptions options;
  options.vocab_size = 290;
  StatusOr<Tokenizer> t = trainer.Train(options);
  ASSERT_TRUE(t.ok());
  StatusOr<Tokenizer> u = Tokenizer::FromJson(t->ToJson(), "mem");
  ASSERT_TRUE(u.ok()) << u.status().ToString();
  EXPECT_EQ(*u->Decode(u->Encode(" abc xbc")), " abc xbc");
}

}  // namespace
}  // namespace orrery
