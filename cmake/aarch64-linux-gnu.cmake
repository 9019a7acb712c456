# Cross toolchain for the phone build: a static aarch64 nl-run with Debian's g++-aarch64-linux-gnu.
#   cmake -S . -B build-arm64 -G Ninja -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake \
#         -DNL_RUNTIME_ONLY=ON -DNL_STATIC=ON -DNL_BUILD_TESTS=OFF
# Header-only dependencies (CLI11, nlohmann/json) come from the host's /usr/include, and only those: the rest of
# /usr/include is x86-64 specific. xxhash is compiled from its header (NL_XXHASH_INLINE) unless libxxhash-dev:arm64
# is installed; liburing is used when liburing-dev:arm64 is installed, else the uring engine falls back to pread.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu /usr/lib/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)
set(ENV{PKG_CONFIG_LIBDIR} /usr/lib/aarch64-linux-gnu/pkgconfig)
set(NL_CROSS_HEADER_ONLY_DIRS /usr/include/CLI /usr/include/nlohmann CACHE INTERNAL "")
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64-static)
