#include "core/config_reference.h"

#include <algorithm>
#include <map>

namespace orrery {
namespace {

// The TOML table a key belongs to: "rl.rollout" for "rl.rollout.slots".
std::string TableOf(const std::string& key) {
  const size_t dot = key.rfind('.');
  return dot == std::string::npos ? "" : key.substr(0, dot);
}

bool InSection(const std::string& key, const std::string& section) {
  if (section.empty() || key == section) return true;
  return key.size() > section.size() && key.compare(0, section.size(), section) == 0 &&
         (key[section.size()] == '.' || key[section.size()] == '[');
}

// "[rl.rollout]", "[[env.mcp]]" for the elements "env.mcp[]".
std::string TableHeading(const std::string& table) {
  if (table.size() > 2 && table.compare(table.size() - 2, 2, "[]") == 0) {
    return "[[" + table.substr(0, table.size() - 2) + "]]";
  }
  return "[" + table + "]";
}

// Text in a table cell: '|' would end the cell and '<' may open an HTML tag ("<run.dir>").
std::string MarkdownCell(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '|' || c == '<') out += '\\';
    out += c;
  }
  return out;
}

// A code span in a table cell: only '|' needs its backslash there.
std::string Code(const std::string& text) {
  if (text.empty()) return "";
  std::string out = "`";
  for (char c : text) {
    if (c == '|') out += '\\';
    out += c;
  }
  return out + "`";
}

}  // namespace

StatusOr<std::string> RenderConfigReference(const std::vector<ConfigKeySpec>& keys,
                                            std::string_view descriptions,
                                            const std::string& descriptions_name,
                                            const std::string& section, const std::string& format) {
  if (format != "text" && format != "md") {
    return InvalidArgumentError("config keys: --format '" + format + "': expected text or md");
  }
  ORRERY_ASSIGN_OR_RETURN(ConfigDocument doc,
                          ConfigDocument::ParseString(descriptions, descriptions_name));
  ConfigTable root = doc.root();
  std::map<std::string, std::string> description;
  for (const ConfigKeySpec& k : keys) {
    const std::string d = root.String(k.key, "");
    if (d.empty()) {
      return NotFoundError(descriptions_name + ": no description of '" + k.key +
                           "', which the config readers read (add a line \"" + k.key +
                           "\" = \"...\")");
    }
    description[k.key] = d;
  }
  if (Status s = doc.Finish(); !s.ok()) {
    return Status(s.code(), s.message() + " (describes no key the config readers read)");
  }

  std::vector<const ConfigKeySpec*> selected;
  for (const ConfigKeySpec& k : keys) {
    if (InSection(k.key, section)) selected.push_back(&k);
  }
  if (selected.empty()) {
    return NotFoundError("config keys: --section '" + section + "': no key is read there");
  }
  // Grouped by table, tables in the order their first key is read, keys in reading order.
  std::vector<std::string> tables;
  std::map<std::string, std::vector<const ConfigKeySpec*>> by_table;
  for (const ConfigKeySpec* k : selected) {
    const std::string t = TableOf(k->key);
    if (!by_table.count(t)) tables.push_back(t);
    by_table[t].push_back(k);
  }
  std::string out;
  if (format == "text") {
    size_t width = 0;
    for (const ConfigKeySpec* k : selected) width = std::max(width, k->key.size());
    for (const std::string& t : tables) {
      for (const ConfigKeySpec* k : by_table[t]) {
        out += k->key + std::string(width + 2 - k->key.size(), ' ') + k->type + " = " +
               k->default_value + (k->allowed.empty() ? "" : ", " + k->allowed) + ": " +
               description[k->key] + "\n";
      }
    }
    return out;
  }
  out =
      "# Configuration keys\n\n"
      "Generated from the config readers by `orrery config keys --format md > "
      "docs/config-reference.md`\n(descriptions: `docs/config-keys.toml`); the `config.reference` "
      "test fails when this file\nis not what the readers read. A key is optional unless its "
      "default says `required`; `unset`\nmeans no value unless given. Relative paths resolve "
      "against the config file's directory.\n\n";
  std::string top;
  for (const std::string& t : tables) {
    const std::string first = t.substr(0, t.find_first_of(".["));
    if (first != top) {
      top = first;
      out += "## " + top + "\n\n";
    }
    out += "### " + MarkdownCell(TableHeading(t)) + "\n\n";
    out += "| key | type | default | allowed | description |\n|---|---|---|---|---|\n";
    for (const ConfigKeySpec* k : by_table[t]) {
      const bool literal = k->default_value != "required" && k->default_value != "unset";
      out += "| `" + k->key.substr(t.empty() ? 0 : t.size() + 1) + "` | " + k->type + " | " +
             (literal ? Code(k->default_value) : k->default_value) + " | " + Code(k->allowed) +
             " | " + MarkdownCell(description[k->key]) + " |\n";
    }
    out += "\n";
  }
  return out;
}

}  // namespace orrery
