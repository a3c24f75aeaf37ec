# `cpack -G DEB` in the build directory: build/paramserver_0.5.0_amd64.deb, the layout of
# cmake/install.cmake under /usr. Its Depends are Debian 12's runtime packages, computed by
# dpkg-shlibdeps from the programs and the library; the CUDA plugin's cuBLAS belongs to no Debian
# package and is left out (dpkg-shlibdeps --ignore-missing-info): GPU workers need the toolkit.
set(PS_PACKAGE_MAINTAINER
  "paramserver maintainers <maintainers@users.noreply.a-seed-320fff2e.example>"
  CACHE STRING "The .deb's Maintainer")
set(PS_PACKAGE_HOMEPAGE "https://paramserver.example.org/" CACHE STRING "The .deb's Homepage")

set(CPACK_PACKAGE_NAME paramserver)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_VENDOR "paramserver")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "asynchronous parameter server for distributed training")
string(CONCAT CPACK_PACKAGE_DESCRIPTION
  "Shards (paramserver ps) hold a model's parameters; workers (paramserver worker, or the Python "
  "client and its PyTorch adapter) push gradients and pull weights over gRPC, asynchronously or "
  "in rounds. One command, paramserver, runs the daemons, a whole job on one machine (paramserver "
  "launch) and the operator's tools (paramserver status, checkpoint, export). Also the C API "
  "(libparamserver_c.so, paramserver/paramserver_c.h, CMake package paramserver) and systemd "
  "units. Workers on a GPU need the CUDA 13 toolkit (cuBLAS), which is not a Debian package.")
# /usr, and the install run with DESTDIR: recipes configured at install time name /usr, not the
# staging directory.
set(CPACK_INSTALL_PREFIX /usr)
set(CPACK_SET_DESTDIR ON)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)  # paramserver_0.5.0_amd64.deb
set(CPACK_DEBIAN_PACKAGE_MAINTAINER ${PS_PACKAGE_MAINTAINER})
set(CPACK_DEBIAN_PACKAGE_HOMEPAGE ${PS_PACKAGE_HOMEPAGE})
set(CPACK_DEBIAN_PACKAGE_SECTION science)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
# launch's default data (/usr/share/datasets/fashion-mnist) and its plot.
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "dataset-fashion-mnist, gnuplot-nox")
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)  # shlibs for libparamserver_c.so.0, ldconfig trigger
include(CPack)
