#include "model/chat_format.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace orrery {
namespace {

class ChatFormatTest : public ::testing::Test {
 protected:
  void SetUp() override {
    BpeTrainer trainer;
    for (int i = 0; i < 20; ++i) {
      trainer.AddText(
          "What is 12*7? The answer is 84. {\"name\": \"calculate\", \"arguments\": "
          "{\"expression\": \"12*7\"}}");
    }
    BpeTrainOptions options;
    options.vocab_size = 350;
    options.special_tokens = ChatSpecialTokens();
    tokenizer_ = *trainer.Train(options);
    StatusOr<ChatFormat> f = ChatFormat::Create(&tokenizer_);
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    format_.emplace(*f);
  }

  std::vector<ChatMessage> Conversation() const {
    ChatMessage sys{ChatRole::kSystem, "Use the calculator.", {}, "", ""};
    ChatMessage user{ChatRole::kUser, "What is 12*7?", {}, "", ""};
    ChatMessage call{
        ChatRole::kAssistant, "", {{"call_0", "calculate", R"({"expression":"12*7"})"}}, "", ""};
    ChatMessage tool{ChatRole::kTool, "84", {}, "call_0", "calculate"};
    ChatMessage answer{ChatRole::kAssistant, "The answer is 84.", {}, "", ""};
    return {sys, user, call, tool, answer};
  }

  std::string Text(const std::vector<int32_t>& ids) const { return *tokenizer_.Decode(ids); }

  Tokenizer tokenizer_;
  std::optional<ChatFormat> format_;
};

TEST_F(ChatFormatTest, RendersTheDocumentedLayout) {
  StatusOr<RenderedChat> r = format_->Render(Conversation());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(Text(r->ids),
            "<|system|>Use the calculator.<|end|><|user|>What is 12*7?<|end|><|assistant|>"
            "<|tool_call|>{\"name\":\"calculate\",\"arguments\":{\"expression\":\"12*7\"}}"
            "<|/tool_call|><|end|><|tool|>84<|end|><|assistant|>The answer is 84.<|end|>");
  ASSERT_EQ(r->loss_mask.size(), r->ids.size());
  ASSERT_EQ(r->roles.size(), r->ids.size());
}

TEST_F(ChatFormatTest, OnlyAssistantTokensAfterTheHeaderAreTargets) {
  RenderedChat r = *format_->Render(Conversation());
  std::string targets;
  for (size_t i = 0; i < r.ids.size(); ++i) {
    const bool assistant = r.roles[i] == static_cast<int8_t>(ChatRole::kAssistant);
    const bool header = r.ids[i] == format_->role_id(ChatRole::kAssistant);
    EXPECT_EQ(r.loss_mask[i], assistant && !header ? 1 : 0) << "token " << i;
    if (r.loss_mask[i]) targets += std::string(tokenizer_.TokenBytes(r.ids[i]));
  }
  EXPECT_EQ(targets,
            "<|tool_call|>{\"name\":\"calculate\",\"arguments\":{\"expression\":\"12*7\"}}"
            "<|/tool_call|><|end|>The answer is 84.<|end|>");
}

TEST_F(ChatFormatTest, PromptEndsWithAnOpenAssistantTurnAndHasNoTargets) {
  std::vector<ChatMessage> convo = Conversation();
  convo.resize(2);
  RenderedChat p = *format_->RenderPrompt(convo);
  EXPECT_EQ(p.ids.back(), format_->role_id(ChatRole::kAssistant));
  for (uint8_t m : p.loss_mask) EXPECT_EQ(m, 0);
}

TEST_F(ChatFormatTest, ParsesWhatItRenders) {
  RenderedChat r = *format_->Render(Conversation());
  // The tokens after the first assistant header are the tool-call turn.
  const int32_t header = format_->role_id(ChatRole::kAssistant);
  size_t start = 0;
  while (r.ids[start] != header) ++start;
  std::vector<int32_t> turn(r.ids.begin() + start + 1, r.ids.end());
  StatusOr<ParsedAssistantTurn> parsed = format_->ParseAssistantTurn(turn);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_TRUE(parsed->finished);
  EXPECT_EQ(parsed->message.content, "");
  ASSERT_EQ(parsed->message.tool_calls.size(), 1u);
  EXPECT_EQ(parsed->message.tool_calls[0].name, "calculate");
  EXPECT_EQ(parsed->message.tool_calls[0].arguments_json, R"({"expression":"12*7"})");
  EXPECT_EQ(parsed->message.tool_calls[0].id, "call_0");

  std::vector<int32_t> text = tokenizer_.Encode("The answer is 84.");
  parsed = format_->ParseAssistantTurn(text);  // ran out before <|end|>
  ASSERT_TRUE(parsed.ok());
  EXPECT_FALSE(parsed->finished);
  EXPECT_EQ(parsed->message.content, "The answer is 84.");
}

TEST_F(ChatFormatTest, MalformedTurnsAreErrors) {
  auto turn = [&](const std::string& body) {
    std::vector<int32_t> ids = {*tokenizer_.SpecialTokenId("<|tool_call|>")};
    for (int32_t id : tokenizer_.Encode(body)) ids.push_back(id);
    ids.push_back(*tokenizer_.SpecialTokenId("<|/tool_call|>"));
    ids.push_back(format_->end_of_turn_id());
    return format_->ParseAssistantTurn(ids);
  };
  EXPECT_TRUE(turn(R"({"name": "calculate", "arguments": {}})").ok());
  EXPECT_FALSE(turn(R"({"name": "calculate", "arguments": {)").ok());
  EXPECT_FALSE(turn(R"({"arguments": {}})").ok());
  EXPECT_FALSE(turn(R"({"name": "calculate", "arguments": "12*7"})").ok());
  EXPECT_FALSE(turn(R"([1, 2])").ok());
  std::vector<int32_t> unclosed = {*tokenizer_.SpecialTokenId("<|tool_call|>")};
  EXPECT_FALSE(format_->ParseAssistantTurn(unclosed).ok());
  std::vector<int32_t> stray = {format_->role_id(ChatRole::kUser)};
  EXPECT_FALSE(format_->ParseAssistantTurn(stray).ok());
}

TEST_F(ChatFormatTest, RejectsBadArgumentsAndTokenizersWithoutChatTokens) {
  std::vector<ChatMessage> convo = {
      {ChatRole::kAssistant, "", {{"call_0", "calculate", "not json"}}, "", ""}};
  EXPECT_FALSE(format_->Render(convo).ok());
  Tokenizer plain = Tokenizer::FromMerges({"<|endoftext|>"}, {});
  EXPECT_NE(ChatFormat::Create(&plain).status().message().find("<|pad|>"), std::string::npos);
}

TEST_F(ChatFormatTest, TextDocumentsEndWithEndOfText) {
  RenderedChat r = format_->RenderText("In the beginning");
  EXPECT_EQ(r.ids.back(), format_->end_of_text_id());
  EXPECT_EQ(Text(r.ids), "In the beginning<|endoftext|>");
  for (uint8_t m : r.loss_mask) EXPECT_EQ(m, 1);
}

}  // namespace
}  // namespace orrery
