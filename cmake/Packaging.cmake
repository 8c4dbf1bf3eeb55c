# `cpack -G DEB` (from the build folder): two packages, installed under /usr
# whatever the build's CMAKE_INSTALL_PREFIX:
#   opguard        opguardd, the opguard CLI, the shim library and header, the
#                  NCCL interposer libopguard_nccl.so (`opguard exec`) (and
#                  opguard-loadgen when tests are built), the systemd unit,
#                  sysusers/tmpfiles snippets and /etc/opguard/opguardd.conf
#                  (a conffile). No torch dependency: a node that only runs
#                  the daemon installs this one.
#   opguard-torch  the opguard Python package with the PyTorch adapter and
#                  the OPGUARD=1 autoload hook, in Debian's python3 path,
#                  built against Debian's libtorch (install component
#                  "torch"). With torch from pip, use `pip install ./python`
#                  into that venv instead (docs/install.md).
#
#   cmake -S . -B build -DCMAKE_BUILD_TYPE=Release && cmake --build build -j
#   (cd build && cpack -G DEB)
#
# The packages are staged with DESTDIR and prefix /usr, so the unit and the
# config, whose paths are written at install time (systemd/install_unit.cmake),
# name /usr/sbin/opguardd and /etc/opguard/opguardd.conf. Dependencies come
# from dpkg-shlibdeps, per package.
install(FILES ${PROJECT_SOURCE_DIR}/docs/daemon.md ${PROJECT_SOURCE_DIR}/docs/storage.md
        DESTINATION ${CMAKE_INSTALL_DOCDIR} OPTIONAL)

set(CPACK_PACKAGE_NAME "opguard")
set(CPACK_PACKAGE_VENDOR "OpGuard")
set(CPACK_PACKAGE_CONTACT "OpGuard maintainers <opguard@localhost>")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "Bit-for-bit comparison of training runs: node daemon, CLI and training shim")
set(CPACK_PACKAGE_DESCRIPTION
    "OpGuard records a fingerprint of every op boundary of a training run and names the first
operation where two runs (or two ranks) stop agreeing. This package holds the node
daemon opguardd (systemd service), the opguard command line, the shim library
that training jobs load with OPGUARD=1 and the NCCL interposer that records NCCL
programs run with `opguard exec`.")
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_INSTALL_PREFIX /usr)
set(CPACK_SET_DESTDIR ON)
set(CPACK_GENERATOR "DEB")
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL opguard)
if(TARGET opguard_torch)
  list(APPEND CPACK_COMPONENTS_ALL torch)
endif()
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION "devel")
set(CPACK_DEBIAN_PACKAGE_PRIORITY "optional")
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_OPGUARD_PACKAGE_NAME "opguard")
# Named as well as found by dpkg-shlibdeps: spdlog (opguardd's and opguard's
# log lines) and the fmt it is built on. CLI11 is header-only.
set(CPACK_DEBIAN_OPGUARD_PACKAGE_DEPENDS "libspdlog1.10, libfmt9")
set(CPACK_DEBIAN_OPGUARD_PACKAGE_RECOMMENDS "systemd")
set(CPACK_DEBIAN_TORCH_PACKAGE_NAME "opguard-torch")
set(CPACK_DEBIAN_TORCH_PACKAGE_SECTION "python")
# The package's folder is python3.X's own (OPGUARD_PYTHON_INSTALL_DIR), and
# the adapter runs inside Debian's torch; libtorch comes from shlibdeps.
if(OPGUARD_PYTHON_INSTALL_DIR MATCHES "python3\\.([0-9]+)")
  math(EXPR _next "${CMAKE_MATCH_1} + 1")
  set(CPACK_DEBIAN_TORCH_PACKAGE_DEPENDS
      "python3 (>= 3.${CMAKE_MATCH_1}), python3 (<< 3.${_next}), python3-torch")
endif()
set(CPACK_DEBIAN_TORCH_PACKAGE_RECOMMENDS "opguard")
set(CPACK_COMPONENT_TORCH_DESCRIPTION
    "OpGuard's recorder for PyTorch training: with OPGUARD=1 in the environment, Debian's python3
records every op boundary of a torch program and sends it to the node's opguardd.")
set(CPACK_STRIP_FILES ON)

# Maintainer scripts and the conffile list (systemd/packaging/), generated
# with the real paths.
set(_pkg_dir ${CMAKE_BINARY_DIR}/packaging)
set(OPGUARD_PKG_SYSCONFDIR /etc)
set(OPGUARD_PKG_SYSUSERS /usr/${OPGUARD_SYSUSERS_DIR}/opguard.conf)
set(OPGUARD_PKG_TMPFILES /usr/${OPGUARD_TMPFILES_DIR}/opguard.conf)
foreach(script postinst prerm postrm conffiles)
  configure_file(${PROJECT_SOURCE_DIR}/systemd/packaging/${script}.in ${_pkg_dir}/${script} @ONLY)
endforeach()
file(CHMOD ${_pkg_dir}/postinst ${_pkg_dir}/prerm ${_pkg_dir}/postrm
     PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ GROUP_EXECUTE WORLD_READ WORLD_EXECUTE)
set(CPACK_DEBIAN_OPGUARD_PACKAGE_CONTROL_EXTRA
    ${_pkg_dir}/postinst ${_pkg_dir}/prerm ${_pkg_dir}/postrm ${_pkg_dir}/conffiles)
set(CPACK_DEBIAN_OPGUARD_PACKAGE_CONTROL_STRICT_PERMISSION ON)

include(CPack)
