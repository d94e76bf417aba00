// The last broken rule of a kernel launch in this process, for callers that load the library with ctypes.
#include <string>

namespace AscendC {
std::string &LastError() {
  static std::string message;
  return message;
}
}  // namespace AscendC

extern "C" const char *MsAtbAscendcLastError() { return AscendC::LastError().c_str(); }
