// The cache admission rules a layout or an image may record, as one enum: parsed from its on-disk / command-line
// name once, where it is read (layout JSON `admission`, manifest `cache_policy`/`planner`, nl-layout solve
// --admission), and carried as the enum from there on. Header-only; the runtime uses it too.
#pragma once
#include <string>

namespace nl {

// kUnset: none recorded (the evaluator's or runtime's own setting). kAll: plain S3-FIFO, every miss admitted.
// kLinkingAligned: the paper's rule, misses read alone admitted, misses inside longer reads with a lower probability.
// kIsolated: the same rule with probability 0, only misses read alone admitted.
// kValue: not S3-FIFO: after each token the cache keeps the bundles whose residency would save the most of the next
// read plan if that token's active set came again (read alone > at a read's end > inside a read > not active), the
// hotter first within a class (runtime/plan/slot_cache.h).
enum class CacheAdmission { kUnset, kAll, kLinkingAligned, kIsolated, kValue };

// The rules a file or option may name, in the order help and error lines list them.
inline constexpr CacheAdmission kCacheAdmissionRules[] = {CacheAdmission::kAll, CacheAdmission::kLinkingAligned,
                                                          CacheAdmission::kIsolated, CacheAdmission::kValue};
// For error lines: the names a file or option may give.
inline constexpr const char* kCacheAdmissions = "\"all\", \"linking-aligned\", \"isolated\" or \"value\"";

// The name written to files ("" for kUnset).
inline const char* cache_admission_name(CacheAdmission a) {
  switch (a) {
    case CacheAdmission::kAll:
      return "all";
    case CacheAdmission::kLinkingAligned:
      return "linking-aligned";
    case CacheAdmission::kIsolated:
      return "isolated";
    case CacheAdmission::kValue:
      return "value";
    case CacheAdmission::kUnset:
      break;
  }
  return "";
}

// One of the four names -> true and *out set; anything else ("" included) -> false, *out untouched.
inline bool cache_admission_parse(const std::string& s, CacheAdmission* out) {
  for (CacheAdmission a : kCacheAdmissionRules)
    if (s == cache_admission_name(a)) {
      *out = a;
      return true;
    }
  return false;
}

}  // namespace nl
