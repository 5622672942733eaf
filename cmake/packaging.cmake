# Installation and packaging: `cmake --install build [--prefix DIR]` puts the four tools in
# bin/ and the files a user needs to run them in share/dhelix/: the JSON Schemas of every
# input and output, the cluster presets as JSON (the same figures dhelix-plan compiles in,
# to read or edit), and the shipped examples (models, HF configs, jobs, plans, data).
# `cpack -G DEB` (run in the build folder) wraps the same tree into a Debian package.
# docs/install.md documents both.

include(GNUInstallDirs)

install(TARGETS dhelix-plan dhelix-profile dhelix-run dhelix-diff
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/schemas/
        DESTINATION ${CMAKE_INSTALL_DATADIR}/dhelix/schemas
        FILES_MATCHING PATTERN "*.schema.json")
install(DIRECTORY ${PROJECT_SOURCE_DIR}/examples/clusters/
        DESTINATION ${CMAKE_INSTALL_DATADIR}/dhelix/presets)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/examples/
        DESTINATION ${CMAKE_INSTALL_DATADIR}/dhelix/examples)
install(FILES ${PROJECT_SOURCE_DIR}/README.md
        DESTINATION ${CMAKE_INSTALL_DOCDIR})

set(CPACK_PACKAGE_NAME dhelix)
set(CPACK_PACKAGE_VENDOR "dhelix")
set(CPACK_PACKAGE_CONTACT "dhelix maintainers <dhelix@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "Plans and runs distributed LLM training that hides communication (DHelix strand interleaving)")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION science)
# Shared-library dependencies are read from the binaries by dpkg-shlibdeps, so the package
# names match whatever Debian release built it. Libraries outside Debian's package database
# (the CUDA toolkit's, when DHELIX_WITH_CUDA is on) are not packages: dpkg-shlibdeps would
# fail on them, so a CUDA build names its non-CUDA dependencies itself (docs/install.md).
if(DHELIX_WITH_CUDA)
  set(CPACK_DEBIAN_PACKAGE_DEPENDS
      "libc6, libstdc++6, libgcc-s1, libfmt9, libopenmpi3, libopenblas0 | libopenblas0-pthread")
else()
  set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
endif()
include(CPack)
