#include <gtest/gtest.h>

#include <fstream>
#include <set>

#include "learner/checkpoint.h"
#include "learner/data_prepare.h"
#include "learner/packer.h"
#include "learner/token_shards.h"
#include "model/chat_format.h"
#include "tests/unit/learner/test_util.h"

namespace orrery {
namespace {

using testing_util::TempDir;
using testing_util::WriteCorpus;

TEST(TokenShardsTest, RoundTripAcrossShardsAndSplits) {
  TempDir dir;
  WriteCorpus(dir.path(), {5, 9, 3, 12, 7}, 50, 2, /*shard_tokens=*/10);
  StatusOr<TokenDataset> ds = TokenDataset::Open(dir.path());
  ASSERT_TRUE(ds.ok()) << ds.status().ToString();
  EXPECT_EQ(ds->num_documents(), 5);
  EXPECT_EQ(ds->num_tokens(), 36);
  EXPECT_EQ(ds->DocumentsInSplit(true), (std::vector<int64_t>{1, 3}));
  DocumentView d3 = ds->document(3);
  ASSERT_EQ(d3.length, 12);
  EXPECT_EQ(d3.ids[0], 21);
  EXPECT_EQ(d3.ids[11], 32);
  EXPECT_TRUE(std::filesystem::exists(dir.path() + "/shard-00002.safetensors"));
}

TEST(TokenShardsTest, RefusesMissingAndCorruptData) {
  TempDir dir;
  EXPECT_EQ(TokenDataset::Open(dir.path() + "/nope").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(TokenDataset::Open(dir.path()).status().code(), StatusCode::kNotFound);
  WriteCorpus(dir.path(), {5, 9}, 50, 0);
  std::filesystem::resize_file(dir.path() + "/shard-00000.safetensors", 40);
  EXPECT_FALSE(TokenDataset::Open(dir.path()).ok());
  auto w = TokenShardWriter::Create({dir.path() + "/x", 100, 10, "t"});
  EXPECT_EQ((*w)->Add({3, 12}, {1, 1}, DocumentKind::kText, false).code(), StatusCode::kOutOfRange);
  EXPECT_FALSE((*w)->Add({}, {}, DocumentKind::kText, false).ok());
}

TEST(PackerTest, RowsHoldDocumentPiecesWithBoundariesAndNextTokenTargets) {
  TempDir dir;
  WriteCorpus(dir.path(), {5, 9, 3, 12, 7}, 1000, 0);
  TokenDataset ds = *TokenDataset::Open(dir.path());
  DocumentPacker packer(&ds, ds.DocumentsInSplit(false), 3, /*shuffle=*/false, /*pad_id=*/999);
  PackedBatch b = packer.Next(2, 8);
  // Row 0: doc0 (5 tokens) + 3 tokens of doc1; row 1: the next 6 of doc1 + 2 of doc2.
  EXPECT_EQ(b.cu_seqlens, (std::vector<int32_t>{0, 5, 8, 14, 16}));
  EXPECT_EQ(b.inputs[0], 0);
  EXPECT_EQ(b.targets[0], 1);
  EXPECT_EQ(b.targets[4], -1);  // last token of doc0 predicts nothing
  EXPECT_EQ(b.inputs[5], 7);    // doc1 starts at id 7
  EXPECT_EQ(b.targets[7], 10);  // a cut keeps its target: doc1's 4th token
  EXPECT_EQ(b.inputs[8], 10);
  // Every position but the last of doc0 and of doc1 (which ends in row 1) has a target.
  EXPECT_EQ(b.num_targets, 14);
  EXPECT_EQ(packer.cursor().position, 2);
  EXPECT_EQ(packer.cursor().doc_offset, 2);
}

TEST(PackerTest, PadsNothingWhenDataWrapsAndCursorRestoresTheStream) {
  TempDir dir;
  WriteCorpus(dir.path(), {5, 9, 3, 12, 7, 4, 4, 8}, 1000, 0);
  TokenDataset ds = *TokenDataset::Open(dir.path());
  DocumentPacker a(&ds, ds.DocumentsInSplit(false), 11, true, 0);
  std::vector<PackedBatch> first;
  for (int i = 0; i < 3; ++i) first.push_back(a.Next(3, 16));  // wraps past one epoch (52 tokens)
  EXPECT_GE(a.cursor().epoch, 2u);
  const PackerCursor mid = a.cursor();
  PackedBatch next = a.Next(2, 32);
  DocumentPacker b(&ds, ds.DocumentsInSplit(false), 11, true, 0);
  b.set_cursor(mid);
  PackedBatch again = b.Next(2, 32);
  EXPECT_EQ(next.inputs, again.inputs);
  EXPECT_EQ(next.targets, again.targets);
  EXPECT_EQ(next.cu_seqlens, again.cu_seqlens);
  // The shuffled order differs between epochs and seeds but covers every document.
  DocumentPacker c(&ds, ds.DocumentsInSplit(false), 12, true, 0);
  EXPECT_NE(c.Next(3, 16).inputs, first[0].inputs);
}

TEST(DataPrepareTest, TextAndChatTranscriptsBecomeDocumentsWithMasks) {
  TempDir dir;
  BpeTrainer trainer;
  trainer.AddText("In the beginning God created the heaven and the earth. What is 2+3? 5");
  BpeTrainOptions to;
  to.vocab_size = 300;
  to.special_tokens = ChatSpecialTokens();
  ASSERT_TRUE(trainer.Train(to)->Save(dir.path() + "/tok.json").ok());
  {
    std::ofstream(dir.path() + "/a.txt") << "para one\nline two\n\npara two\n\n\npara three\n";
    std::ofstream(dir.path() + "/c.jsonl")
        << R"({"messages": [{"role": "user", "content": "What is 2+3?"}, )"
        << R"({"role": "assistant", "content": "5"}]})"
        << "\n";
  }
  DataPrepareOptions o;
  o.tokenizer_path = dir.path() + "/tok.json";
  o.inputs = {dir.path() + "/a.txt", dir.path() + "/c.jsonl"};
  o.out_dir = dir.path() + "/data";
  o.heldout_fraction = 0.0;
  o.text_document_chars = 20;
  StatusOr<DataPrepareSummary> s = PrepareData(o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->text_documents, 3);  // 19 + 11 + 11 characters: no two paragraphs fit in 20
  EXPECT_EQ(s->chat_documents, 1);
  TokenDataset ds = *TokenDataset::Open(o.out_dir);
  ASSERT_EQ(ds.num_documents(), 4);
  EXPECT_EQ(ds.kind(3), DocumentKind::kChat);
  DocumentView chat = ds.document(3);
  int targets = 0;
  for (int64_t i = 0; i < chat.length; ++i) targets += chat.loss_mask[i];
  EXPECT_EQ(targets, 2);  // "5" and <|end|>

  o.inputs = {dir.path() + "/missing.txt"};
  EXPECT_EQ(PrepareData(o).status().code(), StatusCode::kNotFound);
  std::ofstream(dir.path() + "/bad.jsonl") << "{\"messages\": [{\"role\": \"robot\"}]}\n";
  o.inputs = {dir.path() + "/bad.jsonl"};
  Status bad = PrepareData(o).status();
  EXPECT_NE(bad.message().find("bad.jsonl:1"), std::string::npos) << bad.ToString();
}

TEST(SplitTextDocumentsTest, JoinsParagraphsAndCutsLongOnesAtLines) {
  std::vector<std::string> d = SplitTextDocuments("aaaa\nbbbb\ncccc\n\ndd\n", 10);
  std::string joined;
  for (const std::string& s : d) {
    EXPECT_LE(s.size(), 10u);
    joined += s;
  }
  EXPECT_EQ(joined, "aaaa\nbbbb\ncccc\n\ndd\n");
}

TEST(CheckpointTest, WritesAtomicallyKeepsTheNewestAndRefusesCorruption) {
  TempDir dir;
  const std::string ck = dir.path() + "/checkpoints";
  for (int64_t step : {10, 20, 30}) {
    CheckpointContents c;
    c.state.step = step;
    c.state.stage = 1;
    c.state.cursor = {2, 5, 7};
    c.state.seed = 9;
    c.model = {{"w", Tensor::FromVector<float>({2}, {1.0f, static_cast<float>(step)})}};
    c.optimizer = {{"adamw.m/w", Tensor::Zeros({2}, DType::kF32)}};
    c.files = {{"model.toml", "[model]\n"}};
    ASSERT_TRUE(WriteCheckpoint(ck, c, 2).ok());
  }
  EXPECT_FALSE(std::filesystem::exists(ck + "/step-00000010"));
  EXPECT_EQ(*LatestCheckpoint(ck), ck + "/step-00000030");
  StatusOr<LoadedCheckpoint> r = ReadCheckpoint(dir.path());  // a run directory resolves too
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->state.step, 30);
  EXPECT_EQ(r->state.cursor, (PackerCursor{2, 5, 7}));
  EXPECT_EQ(r->model.at("w").data<float>()[1], 30.0f);
  EXPECT_TRUE(std::filesystem::exists(ck + "/step-00000030/model.toml"));

  // Flip one byte of the weights: the hash check names the file.
  {
    std::fstream f(ck + "/step-00000030/model.safetensors",
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-1, std::ios::end);
    f.put('\x7f');
  }
  Status s = ReadCheckpoint(ck + "/step-00000030").status();
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("model.safetensors"), std::string::npos) << s.ToString();
  std::filesystem::remove(ck + "/step-00000020/trainer.json");
  EXPECT_EQ(ReadCheckpoint(ck + "/step-00000020").status().code(), StatusCode::kDataLoss);
  EXPECT_EQ(ReadCheckpoint(dir.path() + "/none").status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace orrery
