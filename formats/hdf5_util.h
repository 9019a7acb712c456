// Small HDF5 helpers shared by the HDF5 formats (trace v1 in formats/, graph files in graph/).
#pragma once
#include <hdf5.h>

#include <mutex>

namespace nl::h5 {

// HDF5 prints its own error stack by default; we report one clear line instead.
inline void silence_hdf5() {
  static std::once_flag once;
  std::call_once(once, [] { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); });
}

// RAII for HDF5 identifiers.
struct Hid {
  hid_t id = -1;
  herr_t (*close)(hid_t) = nullptr;
  Hid() = default;
  Hid(hid_t i, herr_t (*c)(hid_t)) : id(i), close(c) {}
  Hid(Hid&& o) noexcept : id(o.id), close(o.close) { o.id = -1; }
  Hid& operator=(Hid&& o) noexcept {
    reset();
    id = o.id;
    close = o.close;
    o.id = -1;
    return *this;
  }
  ~Hid() { reset(); }
  void reset() {
    if (id >= 0 && close) close(id);
    id = -1;
  }
  bool ok() const { return id >= 0; }
  operator hid_t() const { return id; }
};

}  // namespace nl::h5
