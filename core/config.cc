#include "core/config.h"

#define TOML_HEADER_ONLY 1
#define TOML_ENABLE_FORMATTERS 0
#include <toml++/toml.h>

#include <cmath>
#include <filesystem>
#include <set>
#include <sstream>

namespace orrery {

struct ConfigState {
  std::string source_name;
  std::string base_dir;
  toml::table root;
  std::set<const toml::node*> read;
  Status first_error;
  std::vector<std::pair<std::string, std::string>> resolved;
  bool record_keys = false;
  std::vector<ConfigKeySpec> keys;
  std::set<std::string> keys_seen;
};

namespace {

const toml::table* AsTable(const void* p) { return static_cast<const toml::table*>(p); }
const toml::node* AsNode(const void* p) { return static_cast<const toml::node*>(p); }

std::string Quote(std::string_view s) { return "\"" + std::string(s) + "\""; }

std::string Describe(const toml::node& node) {
  switch (node.type()) {
    case toml::node_type::string:
      return "the string " + Quote(*node.value<std::string>());
    case toml::node_type::integer:
      return std::to_string(*node.value<int64_t>());
    case toml::node_type::floating_point: {
      std::ostringstream os;
      os << *node.value<double>();
      return os.str();
    }
    case toml::node_type::boolean:
      return *node.value<bool>() ? "true" : "false";
    case toml::node_type::table:
      return "a table";
    case toml::node_type::array:
      return "an array";
    default:
      return "a date/time";
  }
}

std::string FormatDouble(double v) {
  std::ostringstream os;
  os.precision(10);
  os << v;
  return os.str();
}

std::string IntRange(int64_t min, int64_t max) {
  if (min == ConfigTable::kIntMin && max == ConfigTable::kIntMax) return "";
  if (max == ConfigTable::kIntMax) return ">= " + std::to_string(min);
  if (min == ConfigTable::kIntMin) return "<= " + std::to_string(max);
  return "[" + std::to_string(min) + ", " + std::to_string(max) + "]";
}

std::string FloatRange(double min, double max) {
  if (min <= -1e308 && max >= 1e308) return "";
  if (max >= 1e308) return ">= " + FormatDouble(min);
  if (min <= -1e308) return "<= " + FormatDouble(max);
  return "[" + FormatDouble(min) + ", " + FormatDouble(max) + "]";
}

template <typename T, typename F>
std::string RenderList(const std::vector<T>& v, F item) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + item(v[i]);
  return s + "]";
}

}  // namespace

bool ConfigTable::Has(std::string_view key) const {
  return table_ != nullptr && AsTable(table_)->contains(key);
}

std::string ConfigTable::KeyPath(std::string_view key) const {
  return path_.empty() ? std::string(key) : path_ + "." + std::string(key);
}

const void* ConfigTable::Node(std::string_view key) const {
  if (table_ == nullptr) return nullptr;
  const toml::node* n = AsTable(table_)->get(key);
  if (n != nullptr) state_->read.insert(n);
  return n;
}

void ConfigTable::Record(std::string_view key, std::string value, bool is_default) {
  state_->resolved.emplace_back(KeyPath(key), is_default ? value + "  # default" : value);
}

void ConfigTable::Spec(std::string_view key, std::string type, std::string def,
                       std::string allowed) {
  if (!state_->record_keys) return;
  std::string path;  // "env.mcp[0].name" -> "env.mcp[].name"
  const std::string full = KeyPath(key);
  for (size_t i = 0; i < full.size(); ++i) {
    path.push_back(full[i]);
    if (full[i] != '[') continue;
    while (i + 1 < full.size() && full[i + 1] != ']') ++i;
  }
  if (!state_->keys_seen.insert(path).second) return;
  state_->keys.push_back(ConfigKeySpec{path, std::move(type), std::move(def), std::move(allowed)});
}

void ConfigTable::Fail(std::string_view key, std::string_view message) {
  if (!state_->first_error.ok()) return;
  int line = 0;
  if (table_ != nullptr) {
    const toml::node* n = AsTable(table_)->get(key);
    line = static_cast<int>(n ? n->source().begin.line : AsTable(table_)->source().begin.line);
  }
  std::string where = state_->source_name;
  if (line > 0) where += ":" + std::to_string(line);
  state_->first_error =
      InvalidArgumentError(where + ": " + KeyPath(key) + ": " + std::string(message));
}

void ConfigTable::TypeError(std::string_view key, const void* node, std::string_view expected) {
  Fail(key, "expected " + std::string(expected) + ", got " + Describe(*AsNode(node)));
}

int64_t ConfigTable::Int(std::string_view key, int64_t def, int64_t min, int64_t max) {
  Spec(key, "integer", std::to_string(def), IntRange(min, max));
  std::optional<int64_t> v = OptionalInt(key, min, max);
  if (!Has(key)) Record(key, std::to_string(def), true);
  return v.value_or(def);
}

int64_t ConfigTable::RequiredInt(std::string_view key, int64_t min, int64_t max) {
  Spec(key, "integer", "required", IntRange(min, max));
  if (!Has(key)) Fail(key, "required key is missing (expected an integer)");
  return OptionalInt(key, min, max).value_or(min < 0 && max > 0 ? 0 : min);
}

std::optional<int64_t> ConfigTable::OptionalInt(std::string_view key, int64_t min, int64_t max) {
  Spec(key, "integer", "unset", IntRange(min, max));
  const void* n = Node(key);
  if (n == nullptr) return std::nullopt;
  std::string range = "an integer";
  if (min != kIntMin || max != kIntMax) {
    range += " in [" + (min == kIntMin ? std::string("-inf") : std::to_string(min)) + ", " +
             (max == kIntMax ? std::string("inf") : std::to_string(max)) + "]";
  }
  std::optional<int64_t> v = AsNode(n)->is_integer() ? AsNode(n)->value<int64_t>() : std::nullopt;
  if (!v) {
    TypeError(key, n, range);
    return std::nullopt;
  }
  if (*v < min || *v > max) {
    TypeError(key, n, range);
    return std::nullopt;
  }
  Record(key, std::to_string(*v), false);
  return v;
}

double ConfigTable::Float(std::string_view key, double def, double min, double max) {
  Spec(key, "number", FormatDouble(def), FloatRange(min, max));
  std::optional<double> v = OptionalFloat(key, min, max);
  if (!Has(key)) Record(key, FormatDouble(def), true);
  return v.value_or(def);
}

double ConfigTable::RequiredFloat(std::string_view key, double min, double max) {
  Spec(key, "number", "required", FloatRange(min, max));
  if (!Has(key)) Fail(key, "required key is missing (expected a number)");
  return OptionalFloat(key, min, max).value_or(min > -1e308 ? min : 0.0);
}

std::optional<double> ConfigTable::OptionalFloat(std::string_view key, double min, double max) {
  Spec(key, "number", "unset", FloatRange(min, max));
  const void* n = Node(key);
  if (n == nullptr) return std::nullopt;
  std::string range = "a number";
  if (min > -1e308 || max < 1e308) {
    range += " in [" + FormatDouble(min) + ", " + FormatDouble(max) + "]";
  }
  const toml::node* node = AsNode(n);
  std::optional<double> v;
  if (node->is_floating_point())
    v = node->value<double>();
  else if (node->is_integer())
    v = static_cast<double>(*node->value<int64_t>());
  if (!v || std::isnan(*v) || *v < min || *v > max) {
    TypeError(key, n, range);
    return std::nullopt;
  }
  Record(key, FormatDouble(*v), false);
  return v;
}

bool ConfigTable::Bool(std::string_view key, bool def) {
  Spec(key, "boolean", def ? "true" : "false", "");
  const void* n = Node(key);
  if (n == nullptr) {
    Record(key, def ? "true" : "false", true);
    return def;
  }
  if (!AsNode(n)->is_boolean()) {
    TypeError(key, n, "true or false");
    return def;
  }
  bool v = *AsNode(n)->value<bool>();
  Record(key, v ? "true" : "false", false);
  return v;
}

std::string ConfigTable::String(std::string_view key, std::string def) {
  Spec(key, "string", Quote(def), "");
  const void* n = Node(key);
  if (n == nullptr) {
    Record(key, Quote(def), true);
    return def;
  }
  if (!AsNode(n)->is_string()) {
    TypeError(key, n, "a string");
    return def;
  }
  std::string v = *AsNode(n)->value<std::string>();
  Record(key, Quote(v), false);
  return v;
}

std::string ConfigTable::RequiredString(std::string_view key) {
  Spec(key, "string", "required", "");
  if (!Has(key)) {
    Fail(key, "required key is missing (expected a string)");
    return "";
  }
  return String(key, "");
}

std::string ConfigTable::Enum(std::string_view key, std::string def,
                              const std::vector<std::string>& choices) {
  std::string one_of = RenderList(choices, Quote);
  Spec(key, "string", Quote(def), one_of.substr(1, one_of.size() - 2));
  std::string v = String(key, def);
  for (const std::string& c : choices) {
    if (c == v) return v;
  }
  std::string list;
  for (size_t i = 0; i < choices.size(); ++i) list += (i ? ", " : "") + Quote(choices[i]);
  Fail(key, "expected one of " + list + ", got " + Quote(v));
  return def;
}

std::string ConfigTable::Path(std::string_view key, std::string def) {
  Spec(key, "path", Quote(def), "");
  std::string v = String(key, def);
  if (v.empty() || std::filesystem::path(v).is_absolute() || !Has(key)) return v;
  return (std::filesystem::path(state_->base_dir) / v).lexically_normal().string();
}

std::string ConfigTable::RequiredPath(std::string_view key) {
  Spec(key, "path", "required", "");
  if (!Has(key)) {
    Fail(key, "required key is missing (expected a path)");
    return "";
  }
  return Path(key, "");
}

std::vector<int64_t> ConfigTable::IntList(std::string_view key, std::vector<int64_t> def,
                                          int64_t min, int64_t max) {
  const void* n = Node(key);
  auto render = [](const std::vector<int64_t>& v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
    return s + "]";
  };
  Spec(key, "array of integers", render(def), IntRange(min, max));
  if (n == nullptr) {
    Record(key, render(def), true);
    return def;
  }
  const toml::array* arr = AsNode(n)->as_array();
  std::vector<int64_t> out;
  if (arr == nullptr) {
    TypeError(key, n, "an array of integers");
    return def;
  }
  for (const toml::node& e : *arr) {
    std::optional<int64_t> v = e.is_integer() ? e.value<int64_t>() : std::nullopt;
    if (!v || *v < min || *v > max) {
      Fail(key, "expected an array of integers in [" + std::to_string(min) + ", " +
                    std::to_string(max) + "], got an element " + Describe(e));
      return def;
    }
    out.push_back(*v);
  }
  Record(key, render(out), false);
  return out;
}

std::vector<double> ConfigTable::FloatList(std::string_view key, std::vector<double> def) {
  const void* n = Node(key);
  auto render = [](const std::vector<double>& v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + FormatDouble(v[i]);
    return s + "]";
  };
  Spec(key, "array of numbers", render(def), "");
  if (n == nullptr) {
    Record(key, render(def), true);
    return def;
  }
  const toml::array* arr = AsNode(n)->as_array();
  if (arr == nullptr) {
    TypeError(key, n, "an array of numbers");
    return def;
  }
  std::vector<double> out;
  for (const toml::node& e : *arr) {
    if (e.is_floating_point())
      out.push_back(*e.value<double>());
    else if (e.is_integer())
      out.push_back(static_cast<double>(*e.value<int64_t>()));
    else {
      Fail(key, "expected an array of numbers, got an element " + Describe(e));
      return def;
    }
  }
  Record(key, render(out), false);
  return out;
}

std::vector<std::string> ConfigTable::StringList(std::string_view key,
                                                 std::vector<std::string> def) {
  const void* n = Node(key);
  auto render = [](const std::vector<std::string>& v) {
    std::string s = "[";
    for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + Quote(v[i]);
    return s + "]";
  };
  Spec(key, "array of strings", render(def), "");
  if (n == nullptr) {
    Record(key, render(def), true);
    return def;
  }
  const toml::array* arr = AsNode(n)->as_array();
  if (arr == nullptr) {
    TypeError(key, n, "an array of strings");
    return def;
  }
  std::vector<std::string> out;
  for (const toml::node& e : *arr) {
    if (!e.is_string()) {
      Fail(key, "expected an array of strings, got an element " + Describe(e));
      return def;
    }
    out.push_back(*e.value<std::string>());
  }
  Record(key, render(out), false);
  return out;
}

ConfigTable ConfigTable::Table(std::string_view key) {
  const void* n = Node(key);
  if (n == nullptr) return ConfigTable(state_, nullptr, KeyPath(key));
  const toml::table* t = AsNode(n)->as_table();
  if (t == nullptr) {
    TypeError(key, n, "a table");
    return ConfigTable(state_, nullptr, KeyPath(key));
  }
  return ConfigTable(state_, t, KeyPath(key));
}

std::vector<ConfigTable> ConfigTable::TableArray(std::string_view key) {
  const void* n = Node(key);
  std::vector<ConfigTable> out;
  if (n == nullptr) return out;
  const toml::array* arr = AsNode(n)->as_array();
  if (arr == nullptr || !arr->is_array_of_tables()) {
    TypeError(key, n, "an array of tables ([[" + std::string(key) + "]])");
    return out;
  }
  for (size_t i = 0; i < arr->size(); ++i) {
    const toml::table* t = (*arr)[i].as_table();
    state_->read.insert(t);
    out.push_back(ConfigTable(state_, t, KeyPath(key) + "[" + std::to_string(i) + "]"));
  }
  return out;
}

// ---------------------------------------------------------------------------------------------

StatusOr<ConfigDocument> ConfigDocument::ParseString(std::string_view text, std::string source_name,
                                                     std::string base_dir) {
  ConfigDocument doc;
  doc.state_ = std::make_unique<ConfigState>();
  doc.state_->source_name = source_name;
  doc.state_->base_dir = std::move(base_dir);
  try {
    doc.state_->root = toml::parse(text, source_name);
  } catch (const toml::parse_error& e) {
    return InvalidArgumentError(source_name + ":" + std::to_string(e.source().begin.line) +
                                ": invalid TOML: " + std::string(e.description()));
  }
  return doc;
}

StatusOr<ConfigDocument> ConfigDocument::ParseFile(const std::string& path,
                                                   const std::string& base_dir) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    return NotFoundError(path + ": config file not found");
  }
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return ErrnoError(path, errno);
  std::string text;
  char buf[65536];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) text.append(buf, n);
  std::fclose(f);
  if (!base_dir.empty()) return ParseString(text, path, base_dir);
  std::string dir = std::filesystem::path(path).parent_path().string();
  return ParseString(text, path, dir.empty() ? "." : dir);
}

ConfigDocument::ConfigDocument(ConfigDocument&&) noexcept = default;
ConfigDocument& ConfigDocument::operator=(ConfigDocument&&) noexcept = default;
ConfigDocument::~ConfigDocument() = default;

ConfigTable ConfigDocument::root() { return ConfigTable(state_.get(), &state_->root, ""); }

const std::string& ConfigDocument::source_name() const { return state_->source_name; }

bool ConfigDocument::HasTopLevel(std::string_view key) const { return state_->root.contains(key); }

namespace {

// Finds the first key (in file order) of a read table that nobody read.
void FindUnread(const toml::table& table, const std::string& path,
                const std::set<const toml::node*>& read, std::string* key, int* line) {
  std::vector<std::pair<int, std::string>> unread;
  for (auto&& [k, v] : table) {
    std::string kp = path.empty() ? std::string(k.str()) : path + "." + std::string(k.str());
    if (read.count(&v) == 0) {
      int l = static_cast<int>(k.source().begin.line);
      if (*key == "" || l < *line) {
        *key = kp;
        *line = l;
      }
      continue;
    }
    if (const toml::table* t = v.as_table()) FindUnread(*t, kp, read, key, line);
    if (const toml::array* a = v.as_array()) {
      for (size_t i = 0; i < a->size(); ++i) {
        if (const toml::table* t = (*a)[i].as_table(); t && read.count(t)) {
          FindUnread(*t, kp + "[" + std::to_string(i) + "]", read, key, line);
        }
      }
    }
  }
}

}  // namespace

Status ConfigDocument::Finish() {
  if (!state_->first_error.ok()) return state_->first_error;
  std::string key;
  int line = 0;
  FindUnread(state_->root, "", state_->read, &key, &line);
  if (!key.empty()) {
    return InvalidArgumentError(state_->source_name + ":" + std::to_string(line) +
                                ": unknown key '" + key + "'");
  }
  return Status::OK();
}

Status ConfigDocument::error() const { return state_->first_error; }

void ConfigDocument::RecordKeys() { state_->record_keys = true; }

const std::vector<ConfigKeySpec>& ConfigDocument::recorded_keys() const { return state_->keys; }

std::string ConfigDocument::ResolvedText() const {
  std::string out;
  for (const auto& [k, v] : state_->resolved) out += k + " = " + v + "\n";
  return out;
}

void ConfigSections::Add(std::string key, Validator validator) {
  sections_.emplace_back(std::move(key), std::move(validator));
}

Status ConfigSections::Validate(ConfigDocument& doc) const {
  ConfigTable root = doc.root();
  for (const auto& [key, validate] : sections_) {
    if (root.Has(key)) validate(root);
  }
  return doc.Finish();
}

std::vector<std::string> ConfigSections::keys() const {
  std::vector<std::string> out;
  for (const auto& [k, v] : sections_) out.push_back(k);
  return out;
}

void ConfigSections::AddKeyExample(std::string toml) { key_examples_.push_back(std::move(toml)); }

StatusOr<std::vector<ConfigKeySpec>> ConfigSections::ListKeys() const {
  std::vector<std::string> documents = {""};
  documents.insert(documents.end(), key_examples_.begin(), key_examples_.end());
  std::vector<ConfigKeySpec> out;
  std::set<std::string> seen;
  for (size_t i = 0; i < documents.size(); ++i) {
    ORRERY_ASSIGN_OR_RETURN(
        ConfigDocument doc,
        ConfigDocument::ParseString(documents[i], "key example " + std::to_string(i)));
    doc.RecordKeys();
    ConfigTable root = doc.root();
    // Every validator, the table present or not: an absent table reads every key's default.
    for (const auto& [key, validate] : sections_) validate(root);
    for (const ConfigKeySpec& k : doc.recorded_keys()) {
      if (seen.insert(k.key).second) out.push_back(k);
    }
  }
  return out;
}

}  // namespace orrery
