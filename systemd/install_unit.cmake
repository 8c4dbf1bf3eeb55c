# Run at install time (`cmake --install`, cpack): writes opguardd.service with
# the paths of the prefix being installed to, and the default config beside
# it. Under /usr (the .deb) the config is /etc/opguard/opguardd.conf, under
# any other prefix PREFIX/etc/opguard/opguardd.conf. file(INSTALL) honours
# DESTDIR, so staged installs (cpack, DESTDIR=...) land in their root.
if(CMAKE_INSTALL_PREFIX STREQUAL "/usr")
  set(_etc /etc)
else()
  set(_etc ${CMAKE_INSTALL_PREFIX}/etc)
endif()
set(OPGUARDD_PATH ${CMAKE_INSTALL_PREFIX}/${OPGUARD_SBINDIR}/opguardd)
set(OPGUARD_CONFIG ${_etc}/opguard/opguardd.conf)
set(OPGUARD_DOC_DIR ${CMAKE_INSTALL_PREFIX}/${OPGUARD_DOCDIR})
configure_file(${OPGUARD_UNIT_IN} ${OPGUARD_UNIT_WORK}/opguardd.service @ONLY)
file(INSTALL ${OPGUARD_UNIT_WORK}/opguardd.service
     DESTINATION ${CMAKE_INSTALL_PREFIX}/${OPGUARD_SYSTEMD_UNIT_DIR})
file(INSTALL ${OPGUARD_CONF} DESTINATION ${_etc}/opguard)
