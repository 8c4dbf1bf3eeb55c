// Test helpers: traces written as token strings. A token's text before '#'
// is its structure (key, name, site); the full token is its output
// fingerprint; a trailing '!' marks a nondeterministic op, a trailing '+' a
// replicated one, a trailing '^' a trusted one (recorded without fingerprints); a token starting with '~' gets a different input digest;
// "A@2" is op A on an edited source line (same loose key as A); "A=q" is op A
// applied to data "q" (its input digest follows op and data, not the site:
// "A=q" and "A@2=q" computed on the same inputs; the data does not change the
// output). "A B#x C!" = three ops; the second is structurally "B" but its
// output differs from a plain "B".
#pragma once

#include <sstream>
#include <string>
#include <vector>

#include "opguard/aligner/trace.h"

namespace opguard::aligner::testing {

inline uint64_t Id(const std::string& s) { return std::hash<std::string>{}(s) | 1; }

inline OpEvent Ev(const std::string& token_in, uint64_t op_index, uint64_t step = 0) {
  std::string token = token_in;
  OpEvent e;
  bool trusted = !token.empty() && token.back() == '^';
  if (trusted) token.pop_back();
  bool replicated = !token.empty() && token.back() == '+';
  if (replicated) token.pop_back();
  bool nd = !token.empty() && token.back() == '!';
  if (nd) token.pop_back();
  bool other_input = !token.empty() && token[0] == '~';
  if (other_input) token = token.substr(1);
  std::string structure = token.substr(0, token.find('#'));
  std::string data;
  if (structure.find('=') != std::string::npos) {
    data = structure.substr(structure.find('=') + 1);
    structure = structure.substr(0, structure.find('='));
  }
  // "A@2": op A on another source line (key and site differ, loose key not).
  std::string op = structure.substr(0, structure.find('@'));
  e.op_index = op_index;
  e.step = step;
  e.name = Id("op:" + op);
  e.site = Id("site:" + structure);
  e.key = Id("key:" + structure);
  e.loose_key = static_cast<uint32_t>(Id("loose:" + op));
  std::string output = token;
  if (!data.empty()) output.erase(output.find('='), data.size() + 1);
  e.outputs = Fp128{Id("out:" + output), 7};
  e.inputs = Fp128{Id(!data.empty()   ? "in:" + op + "=" + data
                      : other_input ? "in2:" + structure
                                    : "in:" + structure),
                   9};
  e.flags = (nd ? OpEvent::kNondeterministic : 0) | (replicated ? OpEvent::kReplicated : 0) |
            (trusted ? OpEvent::kTrusted : 0);
  return e;
}

inline std::vector<std::string> Tokens(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> out;
  for (std::string t; in >> t;) out.push_back(t);
  return out;
}

// op_index = position * stride + base, so gaps can be left between indices.
inline LaneTrace Lane(const std::string& text, uint32_t lane = 0, uint64_t base = 0, uint64_t stride = 1) {
  LaneTrace l;
  l.lane = lane;
  uint64_t k = 0;
  for (const std::string& t : Tokens(text)) l.ops.push_back(Ev(t, base + stride * k++));
  return l;
}

inline RankTrace Rank(uint32_t rank, const std::string& text) {
  RankTrace t;
  t.rank = rank;
  t.lanes.push_back(Lane(text));
  return t;
}

}  // namespace opguard::aligner::testing
