# Cross-compiling for 64-bit ARM Linux with Debian's gcc-aarch64-linux-gnu and
# the arm64 multiarch -dev packages (scripts/test-arm64.sh installs both):
#   cmake -S . -B build-arm64 -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake
# Programs and tests run under qemu-aarch64 (CMAKE_CROSSCOMPILING_EMULATOR).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)

# Headers and libraries: the cross C library under /usr/aarch64-linux-gnu and
# the multiarch packages under /usr/{include,lib}/aarch64-linux-gnu, which
# the Debian cross compiler searches already.  pkg-config must read the arm64
# .pc files only, never the host's.
set(ENV{PKG_CONFIG_LIBDIR} "/usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig")
set(ENV{PKG_CONFIG_PATH} "")
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)

# The host's MPI (mpicc, mpirun) is x86-64; the cross build goes without MPI
# (the comm layer then has its shm and self backends).
set(CMAKE_DISABLE_FIND_PACKAGE_MPI ON)

# qemu-aarch64 runs the programs with the arm64 multiarch C library (package
# libc6:arm64, whose loader is /lib/ld-linux-aarch64.so.1).  No "-L
# /usr/aarch64-linux-gnu": that would take the loader from the cross
# toolchain's libc (another Debian revision) but libc.so.6 from the multiarch
# one, and the mismatch hangs the first pthread_create.
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64)
