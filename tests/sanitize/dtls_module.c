/* A shared object with a small thread-local array: loaded with dlopen, its TLS is dynamic
 * (glibc allocates one block per thread with malloc, on the first __tls_get_addr). Used by
 * dtls_probe.c. */
__thread char dtls_block[40];

char* dtls_touch(void) {
  dtls_block[0] = 1;
  return dtls_block;
}
