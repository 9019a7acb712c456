// The HDF5 attribute readers and writers every HDF5 format uses (formats/hdf5_util.h): one definition, so the
// trace and graph files store attributes alike and report a bad one with the same line.
#include "formats/hdf5_util.h"

#include <cstring>

namespace nl::h5 {

void write_string_attr(hid_t obj, const char* name, const std::string& value) {
  Hid type(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(type, H5T_VARIABLE);
  H5Tset_cset(type, H5T_CSET_UTF8);
  Hid space(H5Screate(H5S_SCALAR), H5Sclose);
  Hid attr(H5Acreate2(obj, name, type, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  const char* p = value.c_str();
  if (!attr.ok() || H5Awrite(attr, type, &p) < 0) throw InternalError(std::string("cannot write attribute ") + name);
}

void write_int_attr(hid_t obj, const char* name, int64_t value) {
  Hid space(H5Screate(H5S_SCALAR), H5Sclose);
  Hid attr(H5Acreate2(obj, name, H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  if (!attr.ok() || H5Awrite(attr, H5T_NATIVE_INT64, &value) < 0)
    throw InternalError(std::string("cannot write attribute ") + name);
}

void write_double_attr(hid_t obj, const char* name, double value) {
  Hid space(H5Screate(H5S_SCALAR), H5Sclose);
  Hid attr(H5Acreate2(obj, name, H5T_IEEE_F64LE, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  if (!attr.ok() || H5Awrite(attr, H5T_NATIVE_DOUBLE, &value) < 0)
    throw InternalError(std::string("cannot write attribute ") + name);
}

bool has_attr(hid_t obj, const char* name) { return H5Aexists(obj, name) > 0; }

namespace {

std::string quoted(const char* name, const std::string& where) {
  return "attribute '" + std::string(name) + "'" + where;
}

// Opens an attribute that must exist and hold exactly one element of a class `class_ok` accepts; `not_class` and
// `not_scalar` end the error line of each failure.
template <class ClassOk>
Hid open_scalar_attr(const std::string& path, hid_t obj, const char* name, const std::string& where, ClassOk class_ok,
                     const char* not_class, const char* not_scalar, Hid* type) {
  if (!has_attr(obj, name)) throw InputError(path, "missing " + quoted(name, where));
  Hid attr(H5Aopen(obj, name, H5P_DEFAULT), H5Aclose);
  if (!attr.ok()) throw InputError(path, "cannot open " + quoted(name, where));
  *type = Hid(H5Aget_type(attr), H5Tclose);
  Hid space(H5Aget_space(attr), H5Sclose);
  // H5Aread writes every element: an array attribute would overrun the one value read below.
  if (!class_ok(H5Tget_class(*type))) throw InputError(path, quoted(name, where) + " is not " + not_class);
  if (H5Sget_simple_extent_npoints(space) != 1) throw InputError(path, quoted(name, where) + " is not " + not_scalar);
  return attr;
}

}  // namespace

std::string read_string_attr(const std::string& path, hid_t obj, const char* name, const std::string& where) {
  Hid type;
  Hid attr = open_scalar_attr(
      path, obj, name, where, [](H5T_class_t c) { return c == H5T_STRING; }, "a string", "a scalar", &type);
  if (H5Tis_variable_str(type) > 0) {
    Hid mt(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(mt, H5T_VARIABLE);
    H5Tset_cset(mt, H5Tget_cset(type));
    char* p = nullptr;
    if (H5Aread(attr, mt, &p) < 0) throw InputError(path, "cannot read " + quoted(name, where));
    std::string s = p ? p : "";
    H5free_memory(p);
    return s;
  }
  const size_t n = H5Tget_size(type);
  if (n > (1u << 20)) throw InputError(path, quoted(name, where) + " is absurdly long");
  std::string s(n, '\0');
  if (H5Aread(attr, type, s.data()) < 0) throw InputError(path, "cannot read " + quoted(name, where));
  s.resize(strnlen(s.c_str(), n));
  return s;
}

int64_t read_int_attr(const std::string& path, hid_t obj, const char* name, const std::string& where) {
  Hid type;
  Hid attr = open_scalar_attr(
      path, obj, name, where, [](H5T_class_t c) { return c == H5T_INTEGER; }, "a scalar integer", "a scalar integer",
      &type);
  if (H5Tget_sign(type) == H5T_SGN_NONE) {
    // An unsigned value past 2^63 would be clipped to 2^63-1 by the conversion: name the number as stored.
    uint64_t u = 0;
    if (H5Aread(attr, H5T_NATIVE_UINT64, &u) < 0) throw InputError(path, "cannot read " + quoted(name, where));
    if (u > uint64_t(INT64_MAX))
      throw InputError(path, quoted(name, where) + " = " + std::to_string(u) + " is out of range");
    return int64_t(u);
  }
  int64_t v = 0;
  if (H5Aread(attr, H5T_NATIVE_INT64, &v) < 0) throw InputError(path, "cannot read " + quoted(name, where));
  return v;
}

double read_number_attr(const std::string& path, hid_t obj, const char* name, const std::string& where) {
  Hid type;
  Hid attr = open_scalar_attr(
      path, obj, name, where, [](H5T_class_t c) { return c == H5T_FLOAT || c == H5T_INTEGER; }, "a scalar number",
      "a scalar number", &type);
  double v = 0;
  if (H5Aread(attr, H5T_NATIVE_DOUBLE, &v) < 0) throw InputError(path, "cannot read " + quoted(name, where));
  return v;
}

}  // namespace nl::h5
