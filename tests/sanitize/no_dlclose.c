/* Preloaded by `make sanitize`: dlclose does nothing. Open MPI unloads its plugins
 * (mca_*.so) and libpmix in MPI_Finalize; LeakSanitizer then sees their still-held
 * allocations at exit as "<unknown module>" frames, which no suppression can name. With
 * the plugins kept loaded, lsan.supp can suppress exactly Open MPI's own leaks. */
int dlclose(void *handle) {
  (void)handle;
  return 0;
}
