// The host of the tests' precompiled header (tests/CMakeLists.txt, NDMESH_TEST_PCH): a target
// that compiles it once with the tests' flags, for every test target to reuse.
int main() { return 0; }
