# `cmake --install build --prefix P` (and `cpack -G DEB`, P=/usr) installs:
#   P/bin/paramserver                      the one command on PATH (tools/paramserver_main.cc)
#   P/libexec/paramserver/                 the programs it runs (ps, worker, launch, ...); launch
#                                          and psctl start the daemons from beside themselves
#   P/LIBDIR/libparamserver_c.so.0         the C API, P/include/paramserver/paramserver_c.h, and
#   P/LIBDIR/cmake/paramserver/            its package: find_package(paramserver CONFIG)
#   P/lib/systemd/system/*.service         units running P/bin/paramserver
#   P/share/paramserver/{docker,k8s,slurm} the other recipes
# No installed RUNPATH names the build tree (CMake drops it): the programs link Debian's libraries.
include(CMakePackageConfigHelpers)
set(PS_LIBEXEC_DIR ${CMAKE_INSTALL_LIBEXECDIR}/paramserver)
set(PS_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/paramserver)
set(PS_SHARE_DIR ${CMAKE_INSTALL_DATADIR}/paramserver)

install(TARGETS paramserver DESTINATION ${CMAKE_INSTALL_BINDIR})
install(TARGETS ps worker evaluator launch experiment psctl export_model
  DESTINATION ${PS_LIBEXEC_DIR})
if(TARGET paramserver_cuda)  # the CUDA backend, loaded from beside the programs
  install(TARGETS paramserver_cuda LIBRARY DESTINATION ${PS_LIBEXEC_DIR})
  # It keeps the toolkit's directory (cuBLAS, not a Debian package), never the build tree's.
  set_target_properties(paramserver_cuda PROPERTIES INSTALL_RPATH_USE_LINK_PATH ON)
endif()

install(TARGETS paramserver_c EXPORT paramserverTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  PUBLIC_HEADER DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/paramserver)
install(EXPORT paramserverTargets NAMESPACE paramserver:: DESTINATION ${PS_CMAKE_DIR})
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/paramserverConfig.cmake.in
  ${PROJECT_BINARY_DIR}/paramserverConfig.cmake INSTALL_DESTINATION ${PS_CMAKE_DIR})
# 0.x: a minor version may change the API.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/paramserverConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/paramserverConfig.cmake
  ${PROJECT_BINARY_DIR}/paramserverConfigVersion.cmake DESTINATION ${PS_CMAKE_DIR})

# ps_install_pointed(SOURCE DESTINATION FROM TO) installs SOURCE into DESTINATION with the text
# FROM replaced by TO, in which @PREFIX@ stands for the prefix given at install time (cmake
# --install --prefix, cpack's /usr): the recipe points at the installed programs.
function(ps_install_pointed source destination from to)
  get_filename_component(name ${source} NAME)
  set(template ${PROJECT_BINARY_DIR}/install-staging/${name}.in)
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${source})
  file(READ ${source} text)
  string(REPLACE "${from}" "${to}" text "${text}")
  file(WRITE ${template} "${text}")
  install(CODE "
    file(READ \"${template}\" text)
    string(REPLACE \"@PREFIX@\" \"\${CMAKE_INSTALL_PREFIX}\" text \"\${text}\")
    # One staged copy per destination: cpack and cmake --install may run at once.
    string(MD5 key \"\$ENV{DESTDIR}\${CMAKE_INSTALL_PREFIX}\")
    set(staged \"${PROJECT_BINARY_DIR}/install-staging/\${key}/${name}\")
    file(WRITE \"\${staged}\" \"\${text}\")
    file(INSTALL \"\${staged}\" DESTINATION \"\${CMAKE_INSTALL_PREFIX}/${destination}\")")
endfunction()

# The units' /opt/paramserver/bin/ps becomes P/bin/paramserver ps.
file(GLOB PS_UNITS ${PROJECT_SOURCE_DIR}/deploy/systemd/*.service)
foreach(unit ${PS_UNITS})
  ps_install_pointed(${unit} lib/systemd/system "/opt/paramserver/bin/"
    "@PREFIX@/${CMAKE_INSTALL_BINDIR}/paramserver ")
endforeach()
# The Slurm script's default programs: the installed ones, not a checkout's build/bin.
ps_install_pointed(${PROJECT_SOURCE_DIR}/deploy/slurm/paramserver.sbatch ${PS_SHARE_DIR}/slurm
  "\${SLURM_SUBMIT_DIR:-\$PWD}/build/bin" "@PREFIX@/${PS_LIBEXEC_DIR}")
# Docker and Kubernetes build and run images from a checkout: installed as they are.
install(DIRECTORY ${PROJECT_SOURCE_DIR}/deploy/docker ${PROJECT_SOURCE_DIR}/deploy/k8s
  DESTINATION ${PS_SHARE_DIR})

include(${CMAKE_CURRENT_LIST_DIR}/package.cmake)
