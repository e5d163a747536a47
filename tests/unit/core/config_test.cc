#include "core/config.h"

#include <gtest/gtest.h>

#include "core/config_reference.h"

namespace orrery {
namespace {

ConfigDocument Parse(const std::string& text) {
  StatusOr<ConfigDocument> doc = ConfigDocument::ParseString(text, "t.toml", "/base");
  EXPECT_TRUE(doc.ok()) << doc.status().ToString();
  return std::move(doc).value();
}

TEST(ConfigTest, ReadsTypedValuesWithDefaults) {
  ConfigDocument doc = Parse(R"(
[model]
hidden = 64
eps = 1e-5
name = "tiny"
layers = [1, 2, 3]
tied = true
data = "data/x"
[[stages]]
seq = 256
[[stages]]
seq = 1024
)");
  ConfigTable root = doc.root();
  ConfigTable m = root.Table("model");
  EXPECT_EQ(m.Int("hidden", 0, 1, 100), 64);
  EXPECT_EQ(m.Int("heads", 4, 1, 100), 4);
  EXPECT_DOUBLE_EQ(m.Float("eps", 0), 1e-5);
  EXPECT_EQ(m.String("name", ""), "tiny");
  EXPECT_EQ(m.IntList("layers", {}), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_TRUE(m.Bool("tied", false));
  EXPECT_EQ(m.Path("data", ""), "/base/data/x");
  EXPECT_FALSE(m.OptionalInt("q_lora").has_value());
  std::vector<ConfigTable> stages = root.TableArray("stages");
  ASSERT_EQ(stages.size(), 2u);
  EXPECT_EQ(stages[0].Int("seq", 0), 256);
  EXPECT_EQ(stages[1].Int("seq", 0), 1024);
  EXPECT_TRUE(doc.Finish().ok());
  std::string text = doc.ResolvedText();
  EXPECT_NE(text.find("model.hidden = 64\n"), std::string::npos);
  EXPECT_NE(text.find("model.heads = 4  # default\n"), std::string::npos);
  EXPECT_NE(text.find("stages[1].seq = 1024\n"), std::string::npos);
}

TEST(ConfigTest, UnknownKeyNamesFileLineAndKey) {
  ConfigDocument doc = Parse("[model]\nhidden = 64\n\nhiden_size = 3\n");
  ConfigTable m = doc.root().Table("model");
  m.Int("hidden", 0);
  Status s = doc.Finish();
  EXPECT_EQ(s.message(), "t.toml:4: unknown key 'model.hiden_size'");
}

TEST(ConfigTest, UnknownSectionAndNestedKeys) {
  ConfigDocument doc = Parse("[model]\nx = 1\n[modle]\ny = 2\n");
  doc.root().Table("model").Int("x", 0);
  EXPECT_EQ(doc.Finish().message(), "t.toml:3: unknown key 'modle'");
  ConfigDocument doc2 = Parse("[[stages]]\nseq = 1\nsteps = 3\n");
  for (ConfigTable& t : doc2.root().TableArray("stages")) t.Int("seq", 0);
  EXPECT_EQ(doc2.Finish().message(), "t.toml:3: unknown key 'stages[0].steps'");
}

TEST(ConfigTest, WrongTypeAndRange) {
  ConfigDocument doc = Parse("[m]\nheads = 0\nname = 5\nlr = \"fast\"\n");
  ConfigTable m = doc.root().Table("m");
  m.Int("heads", 1, 1, 4096);
  m.String("name", "");
  m.Float("lr", 1e-3);
  // The first problem wins.
  EXPECT_EQ(doc.Finish().message(), "t.toml:2: m.heads: expected an integer in [1, 4096], got 0");
  ConfigDocument doc2 = Parse("name = 5\n");
  doc2.root().String("name", "");
  EXPECT_EQ(doc2.Finish().message(), "t.toml:1: name: expected a string, got 5");
  ConfigDocument doc3 = Parse("kind = \"bounded2\"\n");
  doc3.root().Enum("kind", "bounded", {"bounded", "original"});
  EXPECT_EQ(doc3.Finish().message(),
            "t.toml:1: kind: expected one of \"bounded\", \"original\", got \"bounded2\"");
}

TEST(ConfigTest, RequiredAndCrossFieldChecks) {
  ConfigDocument doc = Parse("[m]\na = 3\n");
  ConfigTable m = doc.root().Table("m");
  m.RequiredInt("b", 1, 10);
  EXPECT_EQ(doc.Finish().message(), "t.toml:1: m.b: required key is missing (expected an integer)");
  ConfigDocument doc2 = Parse("[m]\na = 3\n");
  ConfigTable m2 = doc2.root().Table("m");
  if (m2.Int("a", 0) % 2 == 1) m2.Fail("a", "must be even");
  EXPECT_EQ(doc2.Finish().message(), "t.toml:2: m.a: must be even");
}

TEST(ConfigTest, MalformedToml) {
  StatusOr<ConfigDocument> doc = ConfigDocument::ParseString("[model\nx = 1\n", "bad.toml");
  ASSERT_FALSE(doc.ok());
  EXPECT_EQ(doc.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(doc.status().message().rfind("bad.toml:1: invalid TOML: ", 0), 0u)
      << doc.status().message();
  StatusOr<ConfigDocument> dup = ConfigDocument::ParseString("a = 1\na = 2\n", "dup.toml");
  EXPECT_FALSE(dup.ok());
  EXPECT_FALSE(ConfigDocument::ParseFile("/nonexistent/x.toml").ok());
}

TEST(ConfigTest, SectionsValidateWholeDocuments) {
  ConfigSections sections;
  sections.Add("run", [](ConfigTable& root) { root.Table("run").Int("seed", 0, 0); });
  ConfigDocument ok = Parse("[run]\nseed = 3\n");
  EXPECT_TRUE(sections.Validate(ok).ok());
  ConfigDocument bad = Parse("[run]\nseed = 3\n[nope]\nx = 1\n");
  EXPECT_EQ(sections.Validate(bad).message(), "t.toml:3: unknown key 'nope'");
  ConfigDocument neg = Parse("[run]\nseed = -1\n");
  EXPECT_EQ(sections.Validate(neg).message(),
            "t.toml:2: run.seed: expected an integer in [0, inf], got -1");
}

// Recording mode: every getter lists its key, type, default and allowed values, present or not.
TEST(ConfigTest, RecordingListsEveryKeyRead) {
  ConfigDocument doc = Parse("[rl.rollout]\nslots = 4\n[[env.mcp]]\nname = \"fs\"\n");
  doc.RecordKeys();
  ConfigTable root = doc.root();
  ConfigTable rollout = root.Table("rl").Table("rollout");
  (void)rollout.Int("slots", 16, 1, 4096);
  (void)rollout.Int("slots", 16, 1, 4096);  // read twice, listed once
  (void)rollout.Float("top_p", 1.0, 1e-6, 1.0);
  (void)rollout.Enum("env", "local", {"local", "remote"});
  (void)root.Table("run").Int("seed", 0, 0);
  (void)root.Table("run").Path("dir", "runs/x");
  for (ConfigTable& t : root.Table("env").TableArray("mcp")) {
    (void)t.RequiredString("name");
    (void)t.StringList("command", {});
  }
  (void)root.Table("rl").OptionalInt("limit");
  const std::vector<ConfigKeySpec>& keys = doc.recorded_keys();
  ASSERT_EQ(keys.size(), 8u);
  auto expect = [&](size_t i, const char* key, const char* type, const char* def,
                    const char* allowed) {
    EXPECT_EQ(keys[i].key, key);
    EXPECT_EQ(keys[i].type, type) << key;
    EXPECT_EQ(keys[i].default_value, def) << key;
    EXPECT_EQ(keys[i].allowed, allowed) << key;
  };
  expect(0, "rl.rollout.slots", "integer", "16", "[1, 4096]");
  expect(1, "rl.rollout.top_p", "number", "1", "[1e-06, 1]");
  expect(2, "rl.rollout.env", "string", "\"local\"", "\"local\", \"remote\"");
  expect(3, "run.seed", "integer", "0", ">= 0");
  expect(4, "run.dir", "path", "\"runs/x\"", "");
  expect(5, "env.mcp[].name", "string", "required", "");
  expect(6, "env.mcp[].command", "array of strings", "[]", "");
  expect(7, "rl.limit", "integer", "unset", "");
}

TEST(ConfigTest, ListKeysRunsEveryValidatorOnEmptyAndExampleDocuments) {
  ConfigSections sections;
  sections.Add("run", [](ConfigTable& root) { root.Table("run").Int("seed", 0, 0); });
  sections.Add("env", [](ConfigTable& root) {
    ConfigTable env = root.Table("env");
    const std::string name = env.String("name", "calc");
    env.Table(name).Int(name == "calc" ? "difficulty" : "pool_size", 1);
  });
  sections.AddKeyExample("[env]\nname = \"python\"\n");
  StatusOr<std::vector<ConfigKeySpec>> keys = sections.ListKeys();
  ASSERT_TRUE(keys.ok()) << keys.status().ToString();
  std::vector<std::string> names;
  for (const ConfigKeySpec& k : *keys) names.push_back(k.key);
  EXPECT_EQ(names, (std::vector<std::string>{"run.seed", "env.name", "env.calc.difficulty",
                                             "env.python.pool_size"}));
}

TEST(ConfigTest, ErrorIsTheFirstRecordedProblemWithoutTheUnreadKeys) {
  ConfigDocument doc = Parse("[env]\nname = \"x\"\nplugins = 3\n");
  EXPECT_TRUE(doc.error().ok());  // nothing read yet, so no unread-key check either
  ConfigTable env = doc.root().Table("env");
  (void)env.StringList("plugins", {});
  EXPECT_EQ(doc.error().message(), "t.toml:3: env.plugins: expected an array of strings, got 3");
}

TEST(ConfigReferenceTest, RendersMarkdownAndNeedsADescriptionPerKey) {
  const std::vector<ConfigKeySpec> keys = {{"rl.steps", "integer", "120", ">= 1"},
                                           {"rl.rollout.env", "string", "\"local\"", "a | b"}};
  StatusOr<std::string> md = RenderConfigReference(
      keys, "\"rl.steps\" = \"learner updates\"\n\"rl.rollout.env\" = \"where calls run\"\n",
      "d.toml", "rl.rollout", "md");
  ASSERT_TRUE(md.ok()) << md.status().ToString();
  EXPECT_NE(md->find("## rl\n\n### [rl.rollout]\n\n| key | type | default | allowed | "
                     "description |\n|---|---|---|---|---|\n| `env` | string | `\"local\"` | "
                     "`a \\| b` | where calls run |\n"),
            std::string::npos)
      << *md;
  EXPECT_EQ(md->find("learner updates"), std::string::npos);  // another section
  StatusOr<std::string> text = RenderConfigReference(
      keys, "\"rl.steps\" = \"a\"\n\"rl.rollout.env\" = \"b\"\n", "d.toml", "", "text");
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(
      *text,
      "rl.steps        integer = 120, >= 1: a\nrl.rollout.env  string = \"local\", a | b: b\n");

  StatusOr<std::string> missing =
      RenderConfigReference(keys, "\"rl.steps\" = \"a\"\n", "d.toml", "", "md");
  EXPECT_EQ(missing.status().message(),
            "d.toml: no description of 'rl.rollout.env', which the config readers read (add a "
            "line \"rl.rollout.env\" = \"...\")");
  StatusOr<std::string> stale = RenderConfigReference(
      keys, "\"rl.steps\" = \"a\"\n\"rl.rollout.env\" = \"b\"\n\"rl.gone\" = \"c\"\n", "d.toml", "",
      "md");
  EXPECT_EQ(stale.status().message(),
            "d.toml:3: unknown key 'rl.gone' (describes no key the config readers read)");
  EXPECT_FALSE(RenderConfigReference(keys, "", "d.toml", "", "html").ok());
}

}  // namespace
}  // namespace orrery
