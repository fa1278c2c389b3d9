#include "mixtrain/data/unicode_nfc.h"

#include <cstdint>
#include <unordered_map>
#include <utility>
#include <vector>

namespace mixtrain {
namespace {

struct Decomposition {
  uint32_t cp, first, second;  // second 0: a singleton
};
struct CombiningClass {
  uint32_t cp, ccc;
};
struct Composition {
  uint32_t first, second, composite;
};

#include "mixtrain/data/unicode_nfc_tables.inc"

// Hangul syllables (Unicode 3.12): S = SBase + (L * VCount + V) * TCount + T.
constexpr uint32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr uint32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount,
                   kSCount = kLCount * kNCount;

struct Tables {
  std::unordered_map<uint32_t, std::pair<uint32_t, uint32_t>> decomposition;
  std::unordered_map<uint32_t, uint8_t> ccc;
  std::unordered_map<uint64_t, uint32_t> composition;
  // By code point: not "stable". A stable code point is its own NFC, has class 0, never
  // composes with what precedes it, and its decomposition starts with a class-0 character, so
  // nothing before it interacts with it or anything after it: text between two stable code
  // points normalizes on its own.
  std::vector<bool> needs_work;

  Tables() : needs_work(0x110000, false) {
    for (const auto& d : kCanonicalDecomposition) decomposition[d.cp] = {d.first, d.second};
    for (const auto& c : kCombiningClass) {
      ccc[c.cp] = static_cast<uint8_t>(c.ccc);
      needs_work[c.cp] = true;
    }
    std::vector<bool> composite(0x110000, false);
    for (const auto& c : kComposition) {
      composition[(static_cast<uint64_t>(c.first) << 32) | c.second] = c.composite;
      needs_work[c.second] = true;
      composite[c.composite] = true;
    }
    std::vector<uint32_t> full;
    for (const auto& d : kCanonicalDecomposition) {
      full.clear();
      decompose(d.cp, full);
      // Not its own NFC (a singleton, an excluded or non-starter decomposition), or starting
      // with a mark that reordering could move.
      if (!composite[d.cp] || class_of(full[0]) != 0) needs_work[d.cp] = true;
    }
    // Hangul: a V after an L, a T after an LV syllable compose.
    for (uint32_t v = kVBase; v < kVBase + kVCount; ++v) needs_work[v] = true;
    for (uint32_t t = kTBase + 1; t < kTBase + kTCount; ++t) needs_work[t] = true;
  }

  uint8_t class_of(uint32_t cp) const {
    auto it = ccc.find(cp);
    return it == ccc.end() ? 0 : it->second;
  }

  void decompose(uint32_t cp, std::vector<uint32_t>& out) const {
    if (cp >= kSBase && cp < kSBase + kSCount) {
      const uint32_t s = cp - kSBase;
      out.push_back(kLBase + s / kNCount);
      out.push_back(kVBase + (s % kNCount) / kTCount);
      if (s % kTCount != 0) out.push_back(kTBase + s % kTCount);
      return;
    }
    auto it = decomposition.find(cp);
    if (it == decomposition.end()) {
      out.push_back(cp);
      return;
    }
    decompose(it->second.first, out);
    if (it->second.second != 0) decompose(it->second.second, out);
  }

  // The primary composite of (a, b), or 0.
  uint32_t compose(uint32_t a, uint32_t b) const {
    if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount) {
      return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
    }
    if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase &&
        b < kTBase + kTCount) {
      return a + (b - kTBase);
    }
    auto it = composition.find((static_cast<uint64_t>(a) << 32) | b);
    return it == composition.end() ? 0 : it->second;
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

// The code point at text[i] (valid UTF-8), advancing i.
uint32_t next_code_point(std::string_view text, size_t& i) {
  const auto b = static_cast<unsigned char>(text[i]);
  if (b < 0x80) {
    ++i;
    return b;
  }
  const int n = b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
  uint32_t cp = b & (0x7F >> n);
  for (int k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(text[i + k]) & 0x3F);
  i += n;
  return cp;
}

void append_utf8(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

}  // namespace

const char* unicode_nfc_version() {
  return kUnicodeVersion;
}

namespace {

// NFC of a whole text by the book: decompose, reorder, compose.
std::string nfc_of_segment(const Tables& t, std::string_view utf8) {
  // Full canonical decomposition.
  std::vector<uint32_t> d;
  d.reserve(utf8.size());
  for (size_t i = 0; i < utf8.size();) t.decompose(next_code_point(utf8, i), d);
  // Canonical ordering: within each run of non-starters, a stable sort by combining class.
  for (size_t i = 1; i < d.size(); ++i) {
    const uint8_t c = t.class_of(d[i]);
    if (c == 0) continue;
    for (size_t j = i; j > 0; --j) {
      const uint8_t before = t.class_of(d[j - 1]);
      if (before <= c) break;
      std::swap(d[j - 1], d[j]);
    }
  }
  // Canonical composition: each character joins the last starter unless blocked (a character
  // between them of class 0 or of a class >= its own).
  std::vector<uint32_t> out;
  out.reserve(d.size());
  long starter = -1;
  int last_class = -1;  // class of the last character kept after the starter; -1: none
  for (uint32_t cp : d) {
    const uint8_t c = t.class_of(cp);
    if (starter >= 0 && (last_class == -1 || last_class < c)) {
      if (const uint32_t composite = t.compose(out[static_cast<size_t>(starter)], cp)) {
        out[static_cast<size_t>(starter)] = composite;
        continue;
      }
    }
    if (c == 0) {
      starter = static_cast<long>(out.size());
      last_class = -1;
    } else {
      last_class = c;
    }
    out.push_back(cp);
  }
  std::string result;
  result.reserve(utf8.size());
  for (uint32_t cp : out) append_utf8(cp, result);
  return result;
}

}  // namespace

std::string unicode_nfc(std::string_view utf8) {
  const Tables& t = tables();
  // Stable code points are copied; each stretch with work in it, from the last stable code
  // point before it to the next one, is normalized on its own.
  std::string result;
  size_t copied = 0, stable = 0;
  for (size_t i = 0; i < utf8.size();) {
    const size_t at = i;
    if (static_cast<unsigned char>(utf8[i]) < 0x80) {
      stable = at;
      ++i;
      continue;
    }
    if (!t.needs_work[next_code_point(utf8, i)]) {
      stable = at;
      continue;
    }
    size_t end = i;
    while (end < utf8.size()) {
      size_t probe = end;
      if (!t.needs_work[next_code_point(utf8, probe)]) break;
      end = probe;
    }
    if (result.empty()) result.reserve(utf8.size());
    result.append(utf8.substr(copied, stable - copied));
    result += nfc_of_segment(t, utf8.substr(stable, end - stable));
    copied = stable = i = end;
  }
  if (copied == 0) return std::string(utf8);
  result.append(utf8.substr(copied));
  return result;
}

}  // namespace mixtrain
