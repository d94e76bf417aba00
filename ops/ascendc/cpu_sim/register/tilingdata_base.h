// CPU stand-in for CANN's tiling-data macros: each BEGIN_TILING_DATA_DEF block becomes a plain struct
// with set_<field> / get_<field> and the same fields, which the kernels read after
// GET_TILING_DATA_WITH_STRUCT copies it from the tiling argument.
#ifndef MS_ATB_ASCENDC_SIM_TILINGDATA_BASE_H_
#define MS_ATB_ASCENDC_SIM_TILINGDATA_BASE_H_

#include <cstddef>
#include <cstdint>
#include <cstring>

#define BEGIN_TILING_DATA_DEF(name) struct name {
#define TILING_DATA_FIELD_DEF(type, field) \
  type field = 0;                          \
  void set_##field(type v) { field = v; }  \
  type get_##field() const { return field; }
#define END_TILING_DATA_DEF                                                        \
  void SaveToBuffer(void *dst, size_t) const { std::memcpy(dst, this, sizeof(*this)); } \
  size_t GetDataSize() const { return sizeof(*this); }                             \
  }
#define REGISTER_TILING_DATA_CLASS(op, name)

#endif  // MS_ATB_ASCENDC_SIM_TILINGDATA_BASE_H_
