# Install rules: `cmake --install build --prefix P` gives
#   P/include/ndmesh/...                    the public headers
#   P/lib/libndmesh_<layer>.a               one static library per layer
#   P/bin/ndmesh                            the command
#   P/lib/cmake/ndmesh/ndmeshConfig.cmake   find_package(ndmesh) -> ndmesh::<layer>, with
#                                           find_dependency() for MPI, fmt, tomlplusplus,
#                                           BLAS, ZLIB, Threads (and Gloo when built with it)
#   P/lib/pkgconfig/ndmesh.pc               pkg-config --cflags --libs ndmesh
#   P/lib/python3/dist-packages/ndmesh/     the Python package (when built)
include(CMakePackageConfigHelpers)

get_property(NDMESH_INSTALL_LAYERS GLOBAL PROPERTY NDMESH_LAYERS)
set(NDMESH_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/ndmesh)

install(DIRECTORY ${CMAKE_SOURCE_DIR}/include/ndmesh DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS ${NDMESH_INSTALL_LAYERS} EXPORT ndmeshTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS ndmesh RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(EXPORT ndmeshTargets NAMESPACE ndmesh:: DESTINATION ${NDMESH_CMAKE_DIR})

configure_package_config_file(${CMAKE_SOURCE_DIR}/cmake/ndmeshConfig.cmake.in
                              ${CMAKE_BINARY_DIR}/cmake/ndmeshConfig.cmake INSTALL_DESTINATION ${NDMESH_CMAKE_DIR})
write_basic_package_version_file(${CMAKE_BINARY_DIR}/cmake/ndmeshConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/cmake/ndmeshConfig.cmake ${CMAKE_BINARY_DIR}/cmake/ndmeshConfigVersion.cmake
        DESTINATION ${NDMESH_CMAKE_DIR})

# pkg-config: libraries listed dependents first (static link order), then what they use.
set(NDMESH_PC_LIBS "")
foreach(layer train elastic plan parallel model nn comm config launch mesh core)
  if(TARGET ndmesh_${layer})
    string(APPEND NDMESH_PC_LIBS " -lndmesh_${layer}")
  endif()
endforeach()
if(Gloo_FOUND)
  string(APPEND NDMESH_PC_LIBS " -lgloo")
endif()
# The prefix is found from the .pc file's own place, so `--prefix P` at install time works.
file(RELATIVE_PATH NDMESH_PC_TO_PREFIX /p/${CMAKE_INSTALL_LIBDIR}/pkgconfig /p)
configure_file(${CMAKE_SOURCE_DIR}/cmake/ndmesh.pc.in ${CMAKE_BINARY_DIR}/cmake/ndmesh.pc @ONLY)
install(FILES ${CMAKE_BINARY_DIR}/cmake/ndmesh.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
