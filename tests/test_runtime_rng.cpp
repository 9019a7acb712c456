// formats/core/rng.h: the one seeded generator gives the published SplitMix64 reference outputs, so layouts,
// synthetic traces and images cannot drift when it is touched.
#include <doctest/doctest.h>

#include "formats/core/rng.h"

TEST_CASE("SplitMix64 matches the reference outputs for seed 0 and seed 1234567") {
  nl::SplitMix64 r{0};
  CHECK(r.next() == 0xE220A8397B1DCDAFull);
  CHECK(r.next() == 0x6E789E6AA1B965F4ull);
  CHECK(r.next() == 0x06C45D188009454Full);
  nl::SplitMix64 s{1234567};
  CHECK(s.next() == 6457827717110365317ull);
  CHECK(s.next() == 3203168211198807973ull);
  CHECK(nl::splitmix64(1234567) == 6457827717110365317ull);
  uint64_t state = 0;
  CHECK(nl::splitmix64_next(state) == 0xE220A8397B1DCDAFull);
  CHECK(state == nl::kSplitMixGamma);
  nl::SplitMix64 u{42};
  for (int i = 0; i < 1000; ++i) {
    const double x = u.uniform();
    REQUIRE((x >= 0.0 && x < 1.0));
  }
  CHECK(nl::SplitMix64{7}.below(0) == 0);
}
