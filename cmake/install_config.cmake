# Run by `cmake --install` (and CPack): the systemd unit, naming the
# installed binary and config, the logrotate file for --log-file, and the
# config itself unless one is there already (an edited config is never replaced; the sample stays in
# share/doc/rebound/examples). With the prefix /usr the config goes to
# /etc/rebound, with any other prefix under it. Needs REBOUND_SOURCE_DIR
# and REBOUND_BINARY_DIR.
if(CMAKE_INSTALL_PREFIX STREQUAL "/usr")
  set(etc /etc)
else()
  set(etc "${CMAKE_INSTALL_PREFIX}/etc")
endif()
file(READ "${REBOUND_SOURCE_DIR}/deploy/systemd/rebound.service" unit)
string(REPLACE "/usr/local/bin/rebound" "${CMAKE_INSTALL_PREFIX}/bin/rebound"
  unit "${unit}")
string(REPLACE "/etc/rebound/rebound.yaml" "${etc}/rebound/rebound.yaml"
  unit "${unit}")
file(WRITE "${REBOUND_BINARY_DIR}/unit/rebound.service" "${unit}")
file(INSTALL "${REBOUND_BINARY_DIR}/unit/rebound.service"
  DESTINATION "${CMAKE_INSTALL_PREFIX}/lib/systemd/system")
if(EXISTS "$ENV{DESTDIR}${etc}/rebound/rebound.yaml")
  message(STATUS "Kept: $ENV{DESTDIR}${etc}/rebound/rebound.yaml")
else()
  file(INSTALL "${REBOUND_SOURCE_DIR}/deploy/rebound.yaml"
    DESTINATION "${etc}/rebound"
    PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ)
endif()
file(INSTALL "${REBOUND_SOURCE_DIR}/deploy/debian/logrotate"
  DESTINATION "${etc}/logrotate.d" RENAME rebound)
