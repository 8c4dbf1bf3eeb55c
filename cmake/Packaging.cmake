# `cpack -G DEB`: one package an operator installs on a GPU node: opguardd,
# the opguard CLI, the shim libraries (and opguard-loadgen), the systemd
# unit, sysusers/tmpfiles snippets and the default config (a conffile).
#
#   cmake -S . -B build-pkg -DCMAKE_INSTALL_PREFIX=/usr -DCMAKE_BUILD_TYPE=Release \
#         -DOPGUARD_BUILD_TESTS=OFF -DOPGUARD_BUILD_BENCH=OFF
#   cmake --build build-pkg -j && (cd build-pkg && cpack -G DEB)
#
# With the /usr prefix GNUInstallDirs puts the config in /etc/opguard and the
# unit in /usr/lib/systemd/system. Dependencies come from dpkg-shlibdeps.
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
daemon opguardd (systemd service), the opguard command line and the shim library
that training jobs load with OPGUARD=1.")
set(CPACK_PACKAGING_INSTALL_PREFIX ${CMAKE_INSTALL_PREFIX})
set(CPACK_GENERATOR "DEB")
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION "devel")
set(CPACK_DEBIAN_PACKAGE_PRIORITY "optional")
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
# Named as well as found by dpkg-shlibdeps: spdlog (opguardd's and opguard's
# log lines) and the fmt it is built on. CLI11 is header-only.
set(CPACK_DEBIAN_PACKAGE_DEPENDS "libspdlog1.10, libfmt9")
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "systemd")
set(CPACK_STRIP_FILES ON)

# Maintainer scripts and the conffile list (systemd/packaging/), generated
# with the real paths.
set(_pkg_dir ${CMAKE_BINARY_DIR}/packaging)
set(OPGUARD_PKG_SYSCONFDIR ${CMAKE_INSTALL_FULL_SYSCONFDIR})
set(OPGUARD_PKG_SYSUSERS ${CMAKE_INSTALL_PREFIX}/${OPGUARD_SYSUSERS_DIR}/opguard.conf)
set(OPGUARD_PKG_TMPFILES ${CMAKE_INSTALL_PREFIX}/${OPGUARD_TMPFILES_DIR}/opguard.conf)
foreach(script postinst prerm postrm conffiles)
  configure_file(${PROJECT_SOURCE_DIR}/systemd/packaging/${script}.in ${_pkg_dir}/${script} @ONLY)
endforeach()
file(CHMOD ${_pkg_dir}/postinst ${_pkg_dir}/prerm ${_pkg_dir}/postrm
     PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ GROUP_EXECUTE WORLD_READ WORLD_EXECUTE)
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA
    ${_pkg_dir}/postinst ${_pkg_dir}/prerm ${_pkg_dir}/postrm ${_pkg_dir}/conffiles)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)

include(CPack)
