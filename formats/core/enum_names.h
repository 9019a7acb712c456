// Enum <-> name tables written once: each enum that files or options name has one table of {value, name} pairs,
// and its parse and name functions are both read from it (a second hand-written list could disagree with the first).
#pragma once
#include <cstddef>
#include <string_view>

namespace nl {

template <class E>
struct EnumName {
  E value;
  const char* name;
};

// The name of `v` in `table`, or `missing` when the table does not list it.
template <class E, size_t N>
constexpr const char* enum_name(const EnumName<E> (&table)[N], E v, const char* missing = "?") {
  for (const EnumName<E>& e : table)
    if (e.value == v) return e.name;
  return missing;
}

// The value named `s` -> true and *out set; a name the table does not list -> false, *out untouched.
template <class E, size_t N>
constexpr bool enum_parse(const EnumName<E> (&table)[N], std::string_view s, E* out) {
  for (const EnumName<E>& e : table)
    if (s == e.name) {
      *out = e.value;
      return true;
    }
  return false;
}

}  // namespace nl
